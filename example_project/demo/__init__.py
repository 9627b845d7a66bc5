"""The offline demo: a rule-based model, its tools, and what ``manage.py agentloop demo`` asks.

``settings.AGENTLOOP["DEMO"]`` points at :data:`DEMO`; the command in agentloop reads it,
so the library never imports the example project.
"""

DEMO = {
    "title": "agentloop demo",
    "instructions": (
        "You are a helpful assistant. Use the calculator for arithmetic, the weather tool for "
        "weather questions, and save_note / list_notes to remember things for the user; "
        "delete_notes deletes them all and needs the user's approval."
    ),
    "tools": [
        "example_project.demo.tools.calculator",
        "example_project.demo.tools.Weather",
        "example_project.demo.tools.SaveNote",
        "example_project.demo.tools.ListNotes",
        # "Delete my notes" in the demo chat's page asks for approval before it runs.
        "example_project.demo.tools.DeleteNotes",
    ],
    "questions": [
        # One answer asks for three tools at once: a multi-tool round.
        "What is (12 + 30) * 2 - 3 ** 2, and what's the weather in Paris and Tokyo?",
        "Thanks! Remember that I pack an umbrella for Tokyo.",
        # A tool error (division by zero) is a result the model sees, not a crash.
        "What is 7 / 0? And what did I note so far?",
    ],
}
