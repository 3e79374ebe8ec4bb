"""The project's MCP server: a small library catalogue of made-up books, as MCP tools over stdio.

The resources server (app.py) starts it as a subprocess and forwards the policy's tool calls to it. Add a
tool here (`@server.tool()`, typed arguments, a docstring) and the policy sees it: app.py lists the tools
at start-up. Rows advertise the tools they offer, so add it to the rows' `tools` too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

BOOKS: dict[str, dict[str, Any]] = json.loads((Path(__file__).resolve().parent / "data" / "books.json").read_text())
MAX_RESULTS = 10

server = MCPServer(
    "library", instructions="A library catalogue: search books by title or author, then read a book's details."
)


@server.tool()
def search_books(query: str) -> list[dict[str, str]]:
    """Find books whose title or author contains `query` (case-insensitive); returns the id, title and author of each (at most 10)."""  # noqa: E501
    needle = query.strip().casefold()
    found = [
        {"id": book_id, "title": book["title"], "author": book["author"]}
        for book_id, book in BOOKS.items()
        if needle and (needle in book["title"].casefold() or needle in book["author"].casefold())
    ]
    return found[:MAX_RESULTS]


@server.tool()
def book_details(book_id: str) -> dict[str, Any]:
    """The details of a book by its id (from search_books): title, author, year, pages and shelf."""
    if book_id not in BOOKS:
        raise ToolError(f"no book with id {book_id!r}; find ids with search_books")  # the model reads this message
    return {"id": book_id, **BOOKS[book_id]}


if __name__ == "__main__":
    server.run()  # stdio: MCP messages on stdin/stdout
