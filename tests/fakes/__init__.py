"""Test stand-ins; the service never imports these."""
