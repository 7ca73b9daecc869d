"""What a scale run is asked to do (`Settings`), and the names and numbers its parts share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from benchmarks.common import RESULTS

ANNOTATION = "in-place-annotation"
"""In place with arrival by pod annotation and each agent's own watch of its GangJob."""
MODES = (
    "in-place", "process", ANNOTATION, "node-lost", "recreate", "floor",
    "annotation-floor",
)  # fmt: skip
"""Every measurement of GangJob, in the order the report lists them."""
HANG = "hang"
"""Hang detection and restart in a `Process` gang whose trainers report progress: taken only
when `--modes` names it (its trainers' reports and its agents' polls load the simulation)."""
HANG_SECONDS = 10
"""`spec.progress.hangSeconds` of the hang gang."""
HANG_STEPS_PER_SECOND = 2.0
"""How fast the stand-in trainers of the hang gang (and of `--progress`'s twins) report
steps."""
RESIZE = "resize"
"""An elastic gang resized in place by `replicas`, N -> 0.8 N -> N (rows `resize-down`,
`resize-up`), on the in-place gang, made elastic for it: taken only when `--modes` names it."""
RESIZE_ROWS = ("resize-down", "resize-up")
IN_PLACE_TLS = "in-place-tls"
"""The in-place restart of a gang of its own with the controller serving arrivals over TLS (its
own certificate, as deployed), after the in-place gang with plain HTTP: the controller is
restarted for it, and back after. Taken by default, at N <= `TLS_MAX_SIZE` only."""
TLS_MAX_SIZE = 1000
"""The largest N of `in-place-tls`: its goal is judged at N=1000, and at N=5000 a second gang
of 5000 would be the run's longest part."""
ANNOTATION_MAX_SIZE = 1000
"""The largest N of `in-place-annotation`: at N=5000 its 5000 agents' own watches and pod
patches overran the restart's deadline in every full run (at most 642 of 5000 arrived in 1090 s)
and left etcd timing out its writes for whatever came next."""
NODE_LOST_SPARE, NODE_LOST_SPARE_POD, NODE_LOST_SHRINK, NODE_LOST_WAIT = (
    "node-lost-spare", "node-lost-spare-pod", "node-lost-shrink", "node-lost-wait",
)  # fmt: skip
NODE_LOSS = (NODE_LOST_SPARE, NODE_LOST_SPARE_POD, NODE_LOST_SHRINK, NODE_LOST_WAIT)
"""A worker's node lost with no room for its new pod, each in a gang of its own
(`NODE_LOSS_GANGS`), `Process` but where `NODE_LOSS_RESTART_MODES` says: elastic with one
spare (and the same in `Pod` mode); elastic with `waitSeconds: 0`, which shrinks; not elastic,
which waits. Taken only when `--modes` names them."""
NODE_LOSS_GANGS = {
    NODE_LOST_SPARE: "ns", NODE_LOST_SPARE_POD: "nsp", NODE_LOST_SHRINK: "nk", NODE_LOST_WAIT: "nw",
}  # fmt: skip
NODE_LOSS_RESTART_MODES = {NODE_LOST_SPARE_POD: "Pod"}
"""The restart mode of a node-loss gang, where not `Process`."""
NODE_LOST_SPARES = (NODE_LOST_SPARE, NODE_LOST_SPARE_POD)
"""The node-loss modes whose gang has a spare."""
WAIT_BOUND_S = 30.0
"""How long `node-lost-wait` watches the gang wait for a worker no node can take."""
SELECTABLE_MODES = (*MODES, HANG, RESIZE, IN_PLACE_TLS, *NODE_LOSS)
"""What `--modes` may name."""
DEFAULT_MODES = (*MODES, IN_PLACE_TLS)
"""What a run takes unless `--modes` says otherwise."""
PEERS = ("jobset",)
"""Peers `--peers` can measure beside GangJob in the same run."""
JOBSET, JOBSET_RAISED = "jobset", "jobset-raised"
"""The JobSet peer's restart with the controller-manager at its default client QPS (20, burst
30), and with it raised (`Settings.peer_qps`), as an operator of large gangs would."""
PEER_MODES = (JOBSET, JOBSET_RAISED)
IN_PLACE_RAISED = "in-place-raised"
"""GangJob's in-place restart on the controller-manager of `JOBSET_RAISED`, beside it."""
WITH_PROGRESS = "+progress"
"""`--progress`: a mode's twin whose trainers report progress (every agent summarising to the
controller), measured in the same run as the mode itself: `in-place+progress`,
`process+progress`."""
PROGRESS_TWINS = {"in-place": "in-place" + WITH_PROGRESS, "process": "process" + WITH_PROGRESS}
STEADY, STEADY_PROGRESS = "steady", "steady" + WITH_PROGRESS
"""`--progress`: the controller's cost over a window with nothing failing, in the in-place gang
and in its twin whose trainers report (rows of their own, not restarts)."""
PROGRESS_WINDOW_S = 120.0
"""The steady window's length: at least two summary periods at every N up to 6000."""
REPORTED_MODES = (
    "in-place", PROGRESS_TWINS["in-place"], IN_PLACE_TLS, "process", PROGRESS_TWINS["process"],
    *MODES[2:4], *NODE_LOSS, *MODES[4:], *RESIZE_ROWS, HANG, JOBSET, IN_PLACE_RAISED,
    JOBSET_RAISED,
)  # fmt: skip
"""Every row a report can hold, in its order."""
PEER_QPS = 500
"""The controller-manager's raised client QPS for `JOBSET_RAISED` (burst twice that)."""
PEER_MAX_SIZE = 1000
"""The largest gang the peer restarts by default: at the controller-manager's defaults one
JobSet restart takes about 150 s at N=1000, and grows with N."""
PODS_PER_NODE = 250
ANNOTATION_FLOOR_CONCURRENCY = 32
"""annotation-floor: pod annotation patches in flight at once."""
BENCH_LABEL = "gangjob-bench"
BULK_TAINT = "gangjob-bench/bulk"
VICTIMS_LABEL = "gangjob-bench/victims-of"
"""On the single-pod nodes made for one gang's node losses: the gang's name."""
FULL_TAINT = "gangjob-bench/full"
"""NoSchedule on the bulk nodes while a node-loss mode wants no room for a new pod."""
POLL = 0.05
"""Seconds between two looks at a milestone known only by polling (the agents' state)."""


@dataclass
class Settings:
    sizes: list[int]
    reps: int = 3
    restart_delay: float = 2.0
    start_delay: float = 1.3
    scheduler_qps: int | None = None
    endpoint_batch: float | None = None
    """The controller-manager's endpoint update batching period (seconds; default none)."""
    modes: tuple[str, ...] = DEFAULT_MODES
    """Which measurements to take (all by default: they are meant side by side)."""
    peers: tuple[str, ...] = ()
    """Peers to restart the same gang with (`PEERS`), at every size up to `peer_max_size`."""
    peer_max_size: int = PEER_MAX_SIZE
    peer_qps: int = PEER_QPS
    """The controller-manager's client QPS for `JOBSET_RAISED` (burst twice that)."""
    cluster: str = "bench"
    keep: bool = False
    name: str = "restart_scale"
    """The results' file name (`<name>[-qpsQ][-epbatchS].{json,md,png}`)."""
    results_dir: Path = RESULTS
    wait_bound: float = WAIT_BOUND_S
    """How long `node-lost-wait` watches the gang wait (tests shorten it)."""
    rep_limit_s: float | None = None
    """A repetition's time limit, overriding the one that grows with N (tests use it)."""
    progress: bool = False
    """Measure the in-place and process modes again with trainers reporting progress, and the
    controller's cost of progress over a steady window (`PROGRESS_TWINS`, `STEADY`)."""
    progress_window: float = PROGRESS_WINDOW_S
    py_spy: Path | None = None
    """Where py-spy's samples of this process over each measured restart go (None: none)."""
    py_spy_controller: Path | None = None
    """Where py-spy's samples of the controller over each measured restart go (None: none)."""
    progress_settle: float | None = None
    """Seconds from the reporting gang running to its steady window (None: the agents' summary
    period and 5 s, so that every agent reports at its period within the window)."""
