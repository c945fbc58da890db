"""Cost models: the roofline model and the model fitted to profiles."""

import engine.core  # noqa: F401  (checks the compiled build before any sim module loads)
