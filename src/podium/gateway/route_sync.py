"""The sync protocol's old home: it lives in `podium.routes.sync`, shared by gateway and
control."""

from podium.routes.sync import ANSWER_DECODER as ANSWER_DECODER
from podium.routes.sync import ENCODER as ENCODER
from podium.routes.sync import MAX_PENDING as MAX_PENDING
from podium.routes.sync import MAX_PER_REPORT as MAX_PER_REPORT
from podium.routes.sync import REPORT_DECODER as REPORT_DECODER
from podium.routes.sync import EndpointSpec as EndpointSpec
from podium.routes.sync import ModelSpec as ModelSpec
from podium.routes.sync import Outcomes as Outcomes
from podium.routes.sync import ReportingStats as ReportingStats
from podium.routes.sync import SyncAnswer as SyncAnswer
from podium.routes.sync import SyncReport as SyncReport
from podium.routes.sync import TableFollower as TableFollower
from podium.routes.sync import columns as columns
from podium.routes.sync import record_outcomes as record_outcomes
from podium.routes.sync import snapshot as snapshot
