"""What an environment's (or an agent's) author uses: the resources server base with its tools and sessions
(`resources_server`, `tools`), the agent base (`agent_server`) and how an episode ends (`episode`), the trajectory
view (`trajectory`), answer extraction (`answers`), the Gymnasium-style base (`gymnasium`), the statistics of verify
answers (`metrics`), the conformance check (`conformance`) with the bad answers it sends (`bad_answers`), data
validation (`validation`) and test helpers (`testing`).

A new environment needs one import line:

    from nemo_gym.env import ResourcesServer, ServerConfig, Session, Trajectory, VerifyRequest, VerifyResult, tool
"""

from nemo_gym.env.resources_server import ResourcesServer, SeedRequest, VerifyRequest, VerifyResult
from nemo_gym.env.tools import tool
from nemo_gym.env.trajectory import Trajectory
from nemo_gym.serving.server import ServerConfig, Session

__all__ = [
    "ResourcesServer",
    "ServerConfig",
    "Session",
    "SeedRequest",
    "Trajectory",
    "VerifyRequest",
    "VerifyResult",
    "tool",
]
