"""The route table's old home: it lives in `podium.routes.table`, shared by gateway and control."""

from podium.routes.table import LATEST as LATEST
from podium.routes.table import Choose as Choose
from podium.routes.table import Endpoint as Endpoint
from podium.routes.table import Routes as Routes
from podium.routes.table import RouteTable as RouteTable
