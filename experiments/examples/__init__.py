"""Ready experiment files (TOML) for ``twinserve sweep``; see README.md. A package only so that
the files ship with twinserve (package data)."""
