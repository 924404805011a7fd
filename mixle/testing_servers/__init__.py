"""Servers on 127.0.0.1 for testing remote reads: HTTP with Range requests, and S3 (moto).

Both count the requests they answer and can fail on purpose (every k-th request a 503 or
a dropped connection), and can answer byte-range requests wrongly the way misbehaving
servers and proxies do (a shifted range, a truncated body, an HTML error page served with
``200``, the whole object instead of the range), so a pipeline's behaviour against flaky
object stores can be tested without a network:

    with RangeHTTPServer(folder) as server:
        src = mixle.read_zarr(f"{server.url}/volume.zarr")
        ...
        print(server.requests, "requests")

Both are context managers that stop cleanly (their threads joined, sockets closed).
"""

# the private names are the ones this module had before it became a package
from mixle.testing_servers.faults import _RANGE as _RANGE
from mixle.testing_servers.faults import ERROR_PAGE, FaultPlan, shifted
from mixle.testing_servers.http_server import RangeHTTPServer
from mixle.testing_servers.http_server import _ClosingServer as _ClosingServer
from mixle.testing_servers.http_server import _RangeHandler as _RangeHandler
from mixle.testing_servers.http_server import _Serving as _Serving
from mixle.testing_servers.s3_server import _SERVED as _SERVED
from mixle.testing_servers.s3_server import MotoS3Server
from mixle.testing_servers.s3_server import _FaultyApp as _FaultyApp

__all__ = ["ERROR_PAGE", "FaultPlan", "MotoS3Server", "RangeHTTPServer", "shifted"]
