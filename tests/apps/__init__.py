"""Burr's own example applications, vendored to test Rewind on apps it was not written for."""
