"""The project's own studies, as code that imports ictrl (not shipped with it): run from the repository's root as
``python -m studies COMMAND`` (``studies/__main__.py``)."""
