"""Cost models: the roofline model and the model fitted to profiles."""
