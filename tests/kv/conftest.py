"""Helpers for the KV-manager tests."""
