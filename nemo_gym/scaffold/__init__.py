"""Scaffolding: `ng_init` project templates and `ng_init_resources_server`."""
