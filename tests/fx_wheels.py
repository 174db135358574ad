"""Fixtures: small wheels built by the tests (owned by the base/lock work)."""
