"""The model repository: between backends (below) and frontends (above).

    policy      VersionPolicy, version_key: which packaged versions to serve, in what order
    scan        scan_repository: the packages of a `--repository` directory
    stats       ModelStats: what one version has served, in Triton's shape
    entry       ModelEntry: one served version (backend, state, leases, stats)
    inference   the request path on a leased entry: check → backend → outputs → statistics
    repository  ModelRepository: load / unload / lease / index, and the dead-engine hook
"""

from podium.repository.entry import ModelEntry
from podium.repository.policy import VersionPolicy, version_key
from podium.repository.repository import ModelRepository, RequestFor
from podium.repository.scan import scan_repository
from podium.repository.stats import ModelStats

__all__ = ["ModelEntry", "ModelRepository", "ModelStats", "RequestFor", "VersionPolicy",
           "scan_repository", "version_key"]
