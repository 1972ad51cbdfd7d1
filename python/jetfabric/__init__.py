"""jetfabric: a Python client for the jetfabric tensor compute fabric.

The core is the standard library alone: the NATS protocol over a socket
(jetfabric.nats), CBOR (jetfabric.cbor), the JetStream object store
(jetfabric.objectstore). numpy is used when it is installed
(Tensor.numpy(), Session.tensor(ndarray)).

    import jetfabric
    with jetfabric.connect("nats://127.0.0.1:4222") as fab:
        with fab.session() as s:             # the first live device
            x = s.tensor([[1.0, 2.0], [3.0, 4.0]])
            y = (x @ x + 1).sum(axis=0)
            print(y.tolist())                # [23.0, 33.0]

The wire protocol is docs/PROTOCOL.md of the jetfabric repository.
"""

from .client import (
    DTYPES,
    Array,
    Fabric,
    Graph,
    GraphDef,
    Job,
    JobResult,
    Session,
    Tensor,
    all_gather,
    all_reduce,
    broadcast,
    connect,
    live,
    reduce_scatter,
)
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors_all

__version__ = "0.1.0"

__all__ = ["DTYPES", "Array", "Fabric", "Graph", "GraphDef", "Job", "JobResult", "Session", "Tensor", "all_gather", "all_reduce",
           "broadcast", "connect", "live", "reduce_scatter", "__version__"] + list(_errors_all)
