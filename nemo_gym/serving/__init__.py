"""Serving: the HTTP protocol of every gym server on both sides: the server base classes, the process entry point, the
client, the head server, auth, limits and the OpenAI conversions."""
