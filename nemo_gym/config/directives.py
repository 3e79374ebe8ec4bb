"""NeMo Gym 0.7.0's config directives, applied to a merged config before it is resolved (its
`GlobalConfigDictParser._recursively_swap_keys`), so its config files load as NeMo Gym loads them:

- `key: {_inherit_from: a.b, ...}` or `key: ${inherit_from:a.b}`: `key` becomes the value at the dotted path `a.b`
  with `key`'s own entries merged over it, and `a.b` is removed (a move: `single_agent_turn_legacy`'s template
  becomes a configured environment server);
- `key: {_copy: a.b, ...}` or `key: ${copy:a.b}`: the same, but `a.b` stays;
- `key: {_delete_key: "x, y", ...}`: entries `x` and `y` of `key` are removed (after an inherit or copy, from the
  inherited value; each must then exist).

The value taken is the one of the config before any directive ran, as NeMo Gym takes it (a directive inside the
source is not applied to the copy). A top-level move of an agent instance renames it: the environment servers that
named the old instance (`agent_server: {name: old}`) name the new one, as 0.7.0 retargets them (several moves of one
agent are a ConfigError naming them).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from nemo_gym.common.errors import ConfigError

__all__ = ["apply_config_directives"]

INHERIT_FROM = "_inherit_from"
COPY = "_copy"
DELETE_KEY = "_delete_key"
AGENTS = "responses_api_agents"
ENVIRONMENT_SERVERS = "environment_servers"


def _directive(value: Any) -> tuple[str, str, bool] | None:
    """(kind "inherit"/"copy", dotted source path, property form?) of a value that is a directive, else None."""
    if isinstance(value, str):
        for kind, prefix in (("inherit", "${inherit_from:"), ("copy", "${copy:")):
            if value.startswith(prefix) and value.endswith("}"):
                return kind, value[len(prefix) : -1], False
        return None
    if isinstance(value, DictConfig):
        for kind, key in (("inherit", INHERIT_FROM), ("copy", COPY)):
            if key in value:
                return kind, str(value._get_node(key)._value()), True
    return None


class _DirectiveError(Exception):
    def __init__(self, key: str, problem: str):
        super().__init__(problem)
        self.key, self.problem = key, problem


def _at(config: DictConfig, path: list[str], where: str) -> Any:
    node: Any = config
    for part in path:
        if not isinstance(node, DictConfig) or part not in node:
            raise _DirectiveError(where, f"the path {'.'.join(path)!r} it inherits or copies does not exist")
        node = node._get_node(part)
        node = node if isinstance(node, (DictConfig, ListConfig)) else node._value()
    return node


def _apply(node: DictConfig, root: DictConfig, frozen: DictConfig, prefix: str) -> None:
    for key in list(node.keys()):
        if key not in node:  # moved away by an `_inherit_from` of a key before it
            continue
        value = node._get_node(key)
        value = value if isinstance(value, (DictConfig, ListConfig)) else value._value()
        where = f"{prefix}{key}"
        to_delete: set[str] = set()
        if isinstance(value, DictConfig) and DELETE_KEY in value:
            to_delete = {k.strip() for k in str(value.pop(DELETE_KEY)).split(",")}
            for name in [k for k in to_delete if k in value]:  # the others may come with an inherited value
                value.pop(name)
                to_delete.discard(name)
        if isinstance(value, DictConfig):
            _apply(value, root, frozen, f"{where}.")
        elif isinstance(value, ListConfig):
            for index in range(len(value)):  # its nodes, unresolved (iterating would resolve `${...}` items)
                item = value._get_node(index)
                if isinstance(item, DictConfig):
                    _apply(item, root, frozen, f"{where}.{index}.")
        directive = _directive(value)
        if directive is not None:
            kind, source, is_property = directive
            path = source.split(".")
            taken = copy.deepcopy(_at(frozen, path, where))
            if kind == "inherit":
                parent = _at(root, path[:-1], where) if len(path) > 1 else root
                if isinstance(parent, DictConfig):
                    parent.pop(path[-1], None)  # several keys may inherit from one path
            if is_property:
                value.pop(INHERIT_FROM if kind == "inherit" else COPY)
                taken = OmegaConf.merge(taken, value) if isinstance(taken, DictConfig) else taken
            node[key] = taken
        for name in to_delete:
            if not isinstance(node[key], DictConfig) or name not in node[key]:
                raise _DirectiveError(where, f"_delete_key names {name!r}, which it does not have")
            node[key].pop(name)


def _agent_instances(config: DictConfig) -> set[str]:
    return {
        str(name) for name, value in config.items_ex(resolve=False) if isinstance(value, DictConfig) and AGENTS in value
    }


def _agent_references(config: DictConfig) -> list[tuple[str, DictConfig]]:
    """(environment server instance, reference) of every environment server's reference to an agent instance."""
    found = []
    for name, value in config.items_ex(resolve=False):
        servers = value.get(ENVIRONMENT_SERVERS) if isinstance(value, DictConfig) else None
        for server in servers.values() if isinstance(servers, DictConfig) else ():
            for key, field in server.items_ex(resolve=False) if isinstance(server, DictConfig) else ():
                if not isinstance(field, DictConfig) or "name" not in field:
                    continue
                if field.get("type") == AGENTS or (key == "agent_server" and field.get("type") is None):
                    found.append((str(name), field))
    return found


def apply_config_directives(config: DictConfig, origin: Callable[[str], str] = lambda key: "<config>") -> None:
    """Apply the directives of the module docstring to `config` (merged, unresolved), in place. `origin(key)`: the
    file that set a top-level key, for error messages.

    Raises:
        ConfigError: `<file>: key '<dotted key>': ...`: a directive whose source path does not exist, a
            `_delete_key` entry the value lacks, or an agent moved to several names that an environment server
            still names.
    """
    frozen = copy.deepcopy(config)
    agents = _agent_instances(frozen)
    moves: dict[str, list[str]] = {}
    for name, value in frozen.items_ex(resolve=False):
        directive = _directive(value)
        if directive and directive[0] == "inherit" and directive[1] in agents:
            moves.setdefault(directive[1], []).append(str(name))
    with open_dict(config):
        try:
            _apply(config, config, frozen, "")
        except _DirectiveError as exc:
            raise ConfigError(f"{origin(exc.key)}: key {exc.key!r}: {exc.problem}") from None
        moved = {
            source: [t for t in targets if t in config] for source, targets in moves.items() if source not in config
        }
        for server, reference in _agent_references(config):
            targets = moved.get(reference.get("name"), [])
            if len(targets) > 1:
                raise ConfigError(
                    f"{origin(server)}: key {server!r}: it names agent {reference.name!r}, which was inherited into"
                    f" several names ({', '.join(targets)}): give each new agent an environment server of its own"
                )
            if targets:
                reference.name = targets[0]
