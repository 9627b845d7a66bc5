"""``MemoryAdmin``: an owner's memories, filtered by subject and owner, searched by text or
by meaning.

The search box matches the text (``icontains``) unless the "search by" filter says
"meaning": then the query is embedded with the memories' own embedding model (the one most
of the listed rows were embedded with) and the rows nearest it come first, each with its
cosine distance. A memory's text is untrusted (a model or a user wrote it): it is shown
escaped, as every value of the list is.
"""

from __future__ import annotations

from typing import Any

from django.contrib import admin, messages
from django.contrib.admin.views.main import ORDER_VAR
from django.db.models import Case, Count, FloatField, IntegerField, Value, When
from django.http import HttpRequest
from django.utils.translation import gettext_lazy as _

from ..exceptions import AgentloopError
from ..models import Memory

__all__ = ["MemoryAdmin", "SearchByFilter", "SubjectFilter"]

#: rows a search by meaning lists (the nearest first).
MEANING_RESULTS = 100
#: subjects the subject filter offers (those with the most memories).
SUBJECTS_LISTED = 50


class SubjectFilter(admin.SimpleListFilter):
    """The budget subject the memories belong to ("auth.user:42", a team...)."""

    title = _("subject")
    parameter_name = "subject"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        counted = (
            model_admin.get_queryset(request)
            .order_by()
            .values("subject")
            .annotate(count=Count("pk"))
            .order_by("-count", "subject")[:SUBJECTS_LISTED]
        )
        return [(row["subject"], f"{row['subject']} ({row['count']})") for row in counted]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        return queryset.filter(subject=value) if value else queryset


class SearchByFilter(admin.SimpleListFilter):
    """How the search box's words are matched: in the text, or by meaning."""

    title = _("search by")
    parameter_name = "by"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [("meaning", _("meaning (nearest first)"))]

    def choices(self, changelist: Any) -> Any:
        for choice in super().choices(changelist):
            if choice["display"] == _("All"):
                choice["display"] = _("text")
            yield choice

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        return queryset  # the search does the work (MemoryAdmin.get_search_results)


def _by_meaning(request: HttpRequest) -> bool:
    return request.GET.get(SearchByFilter.parameter_name) == "meaning"


class MemoryAdmin(admin.ModelAdmin):
    """Memories per owner and subject: their text, where they came from, how they were
    embedded; searched by text or by meaning."""

    list_display = (
        "short_text", "subject", "owner", "agent", "embedding_model", "dimensions",
        "distance_shown", "created_at", "expires_at",
    )  # fmt: skip
    list_filter = (
        SearchByFilter, SubjectFilter, ("owner", admin.RelatedOnlyFieldListFilter),
        "embedding_model",
    )  # fmt: skip
    search_fields = ("text",)
    search_help_text = _(
        "Words in the text; with 'search by: meaning', the memories nearest the query."
    )
    list_select_related = ("owner",)
    raw_id_fields = ("owner", "chat", "message")
    readonly_fields = ("embedding_model", "dimensions", "created_at", "updated_at")
    exclude = ("embedding",)  # numbers computed from the text: nothing to read or edit

    @admin.display(description=_("text"))
    def short_text(self, memory: Memory) -> str:
        # Returned as plain text: the admin escapes it (a memory's text is untrusted).
        return memory.text if len(memory.text) <= 120 else memory.text[:117] + "..."

    @admin.display(description=_("distance"), ordering="search_distance")
    def distance_shown(self, memory: Memory) -> str:
        distance = getattr(memory, "search_distance", None)
        return "—" if distance is None else f"{distance:.3f}"

    def get_search_results(
        self, request: HttpRequest, queryset: Any, search_term: str
    ) -> tuple[Any, bool]:
        if not (_by_meaning(request) and search_term.strip()):
            return super().get_search_results(request, queryset, search_term)
        return self._nearest(request, queryset, search_term.strip()), False

    def _nearest(self, request: HttpRequest, queryset: Any, query: str) -> Any:
        """The listed rows nearest ``query``, ranked, embedded as most of them were."""
        embedding = queryset.usual_embedding()
        if embedding is None:
            messages.warning(request, _("No memory here has an embedding to search by meaning."))
            return queryset.none()
        model, dimensions = embedding
        try:
            nearest = queryset.nearest_text(query, embedding, k=MEANING_RESULTS, owner=request.user)
        except (AgentloopError, ValueError) as exc:
            messages.error(request, _("Can't embed the query with %s: %s") % (model, exc))
            return queryset.none()
        others = queryset.exclude(embedding_model=model, dimensions=dimensions).count()
        note = _("Nearest %(count)d by meaning (%(model)s, %(dimensions)d dimensions).") % {
            "count": len(nearest),
            "model": model,
            "dimensions": dimensions,
        }
        if others:
            note += " " + (
                _("%d memories embedded by other models (or at other lengths) are not compared.")
                % others
            )
        messages.info(request, note)
        pks = [memory.pk for memory in nearest]
        ranked = queryset.filter(pk__in=pks).annotate(
            search_rank=Case(
                *[When(pk=pk, then=Value(rank)) for rank, pk in enumerate(pks)],
                output_field=IntegerField(),
            ),
            search_distance=Case(
                *[When(pk=memory.pk, then=Value(memory.distance)) for memory in nearest],
                output_field=FloatField(),
            ),
        )
        # Nearest first, unless a column of the list is sorted.
        return ranked if ORDER_VAR in request.GET else ranked.order_by("search_rank", "-pk")


admin.site.register(Memory, MemoryAdmin)
