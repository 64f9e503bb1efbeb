"""Admission, queueing and batch execution of one model's work.

One request queue per model (``requests.RequestQueue``: admission, the bound → 429, deadlines
→ 504, abandoned and disconnected work, fair order, drain) hands its items to one of two
executors composed with it, each owning its threads: ``whole_batch.WholeBatchExecutor`` (a
batch runs to its end on a worker thread) or ``continuous.ContinuousExecutor`` (sentences join
and leave a running decode between steps). Batches are formed by pure functions
(``forming.py``); small requests may use the express worker in either (``express.py``).
"""

from service.queue.admission import DecodeBudget
from service.queue.continuous import ContinuousExecutor, DecodeTooLarge
from service.queue.errors import DeadlineExceeded, EngineFailure, QueueClosed, QueueFull
from service.queue.forming import BatchPolicy, Pending
from service.queue.requests import Executor, RequestQueue, off_the_loop_if_large
from service.queue.whole_batch import WholeBatchExecutor

__all__ = [
    "BatchPolicy",
    "ContinuousExecutor",
    "DeadlineExceeded",
    "DecodeBudget",
    "DecodeTooLarge",
    "EngineFailure",
    "Executor",
    "Pending",
    "QueueClosed",
    "QueueFull",
    "RequestQueue",
    "WholeBatchExecutor",
    "off_the_loop_if_large",
]
