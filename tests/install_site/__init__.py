"""Code the install test copies into its ``startproject`` site (a project's own code)."""
