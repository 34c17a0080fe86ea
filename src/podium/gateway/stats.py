"""The version stats' old home: they live in `podium.routes.stats`, shared by gateway and
control."""

from podium.routes.stats import MAX_SAMPLES as MAX_SAMPLES
from podium.routes.stats import Outcome as Outcome
from podium.routes.stats import VersionHealth as VersionHealth
from podium.routes.stats import VersionStats as VersionStats
