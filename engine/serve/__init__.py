"""The real online/offline path around the engine core: front end, output path, engine loop."""
