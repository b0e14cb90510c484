"""A small pool hierarchy with no contract: what ``kvcache drift`` is for."""
