"""The model repository: between backends (below) and frontends (above).

    policy      VersionPolicy, version_key: which packaged versions to serve, in what order
    scan        scan_repository: the packages of a `--repository` directory
    stats       ModelStats: what one version has served, in Triton's shape
    entry       ModelEntry: one served version (backend, state, leases, stats)
    inference   the request path on a leased entry: check → backend → outputs → statistics
    repository  ModelRepository: load / unload / lease / index, and the dead-engine hook
    load_request  LoadRequest: a load request's policy and Triton's config override
    triton_metrics  Triton's nv_inference_* metrics from the repository's statistics
    poll        RepositoryPoller: --model-control-mode poll, one poll at a time
"""

from podium.repository.entry import ModelEntry
from podium.repository.load_request import LoadRequest
from podium.repository.policy import VersionPolicy, version_key
from podium.repository.repository import ModelRepository, RequestFor
from podium.repository.scan import scan_repository
from podium.repository.stats import ModelStats

__all__ = ["LoadRequest", "ModelEntry", "ModelRepository", "ModelStats",
           "RequestFor", "VersionPolicy", "scan_repository", "version_key"]
