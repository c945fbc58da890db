"""Cost models: the roofline model and the model fitted to profiles."""

from engine.core.compiled import check_compiled_package

check_compiled_package(__file__)  # refuse compiled modules older than their sources
