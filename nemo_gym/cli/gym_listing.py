"""The `gym list ...` and `gym search ...` routes of `nemo_gym.cli.gym_router`: the catalog of environments and
benchmarks (ng_list_environments, ng_list_benchmarks), the resources servers, agents and model servers
(ng_environments)."""

from __future__ import annotations

from nemo_gym.cli.gym_flags import CATALOG_KIND, JSON, SEARCH_DIR, Flag, Route, value_flag

__all__ = ["CATALOG_SEARCH", "LISTING_ROUTES"]

_INSPECT = Flag(
    lambda p: p.add_argument("name", nargs="?", metavar="NAME", help="Show this one."),
    lambda a: ([a.name] if "=" in a.name else [f"+name={a.name}"]) if a.name else [],  # a `+key=value`: passed on
)

# `gym list|search agents|models` (ng_environments' +kind): what is listed, its columns, what a query matches
_LISTED = {
    "agents": ("agents", "name, composition, variants, description", "name, description or variants"),
    "models": ("model servers", "the --model-type names and their model group", "name or model group"),
}
_QUERY = Flag(lambda p: p.add_argument("query", metavar="QUERY"), lambda a: [f"+query={a.query}"])


def _kind(kind: str) -> Flag:
    """No flag of its own: the route's fixed `+kind=`."""
    return Flag(lambda p: None, lambda a: [f"+kind={kind}"])


# `gym search QUERY` (no kind): 0.7.0 searches its whole catalog, environments and benchmarks
CATALOG_SEARCH = "search catalog"

LISTING_ROUTES: dict[str, Route] = {
    "list benchmarks": Route(
        "List the benchmarks of the catalog: name, status, lifecycle, domain, description; NAME shows one"
        " (ng_list_benchmarks).",
        "list_benchmarks",
        (_INSPECT, JSON, SEARCH_DIR),
    ),
    "list environments": Route(
        "List the catalog of environments and benchmarks (environments/, benchmarks/, runnable resources server"
        " configs); NAME shows one (ng_list_environments).",
        "list_environments",
        (
            _INSPECT,
            value_flag("domain", "domain", "Filter by domain."),
            CATALOG_KIND,
            value_flag("modality", "modality", "Filter by modality.", quote=True),
            value_flag("licensing", "licensing", "Filter by licensing.", quote=True),
            value_flag("status", "status", "Filter by manifest status.", choices=("experimental", "no-manifest")),
            value_flag("lifecycle", "lifecycle", "Filter by lifecycle.", choices=("active", "deprecated")),
            JSON,
            SEARCH_DIR,
        ),
    ),
    **{
        f"search {kind}": Route(
            f"The catalog's {kind} whose name, domain or description match QUERY, as 0.7.0 matches them"
            f" (ng_list_environments +catalog_kind={kind[:-1]} +query=QUERY).",
            "list_environments",
            (Flag(lambda p: None, lambda a, k=kind[:-1]: [f"+catalog_kind={k}"]), _QUERY, JSON, SEARCH_DIR),
        )
        for kind in ("environments", "benchmarks")
    },
    CATALOG_SEARCH: Route(
        "The environments and benchmarks whose name, domain or description match QUERY: what `gym search QUERY`"
        " runs (ng_list_environments +query=QUERY).",
        "list_environments",
        (_QUERY, JSON, SEARCH_DIR),
    ),
    "list resources-servers": Route(
        "List the environments (resources servers): name, domain, description; NAME shows one (ng_environments).",
        "environments",
        (_INSPECT, JSON, SEARCH_DIR),
    ),
    "search resources-servers": Route(
        "The environments (resources servers) whose name, domain or description match QUERY, as 0.7.0 matches them"
        " (ng_environments +query=QUERY).",
        "environments",
        (_QUERY, JSON, SEARCH_DIR),
    ),
    **{
        f"list {kind}": Route(
            f"List the {noun}: {columns}; NAME shows one (ng_environments +kind={kind}).",
            "environments",
            (_kind(kind), _INSPECT, JSON, SEARCH_DIR),
        )
        for kind, (noun, columns, _) in _LISTED.items()
    },
    **{
        f"search {kind}": Route(
            f"The {noun} whose {matched} match QUERY, as 0.7.0 matches them (ng_environments +kind={kind}"
            " +query=QUERY).",
            "environments",
            (_kind(kind), _QUERY, JSON, SEARCH_DIR),
        )
        for kind, (noun, _, matched) in _LISTED.items()
    },
}
