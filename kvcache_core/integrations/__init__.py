"""Optional integrations of kvcache pools into other libraries' engines; each module imports its library only when it is imported itself."""
