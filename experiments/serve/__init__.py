"""What `twinserve serve` composes above both worlds: the engine factories handed to the
server processes (``engines``) and a served run's directory (``run_dir``)."""
