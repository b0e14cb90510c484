"""Pools whose imports only resolve on a GPU machine: the source level must still check them."""
