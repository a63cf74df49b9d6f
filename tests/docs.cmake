# ---- the user guide (docs/, mkdocs.yml) and the README's quickstarts ----
