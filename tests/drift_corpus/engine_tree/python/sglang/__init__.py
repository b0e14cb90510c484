"""A fake engine package laid out like sglang's: ``srt/`` and below are namespace packages."""
