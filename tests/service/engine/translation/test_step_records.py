"""engine/translation/step_records.py: a row traced back through the rows each step kept, and
only the steps a running sentence can still trace back to held. (That the traces equal what each
sentence's own search carries is test_beam_step.py's.)"""

from __future__ import annotations

import numpy as np

from service.engine.translation.step_records import StepRecords


def test_a_row_is_traced_back_through_its_parents() -> None:
    records = StepRecords()
    records.begin(np.array([[1, 0], [0, 1]], dtype=np.float32), np.array([0.0, -1.0]))
    records.end(np.array([1, 0]), longest=9)  # the next step's row 0 continues row 1, row 1 row 0
    records.begin(np.array([[0.5, 0.5], [0.2, 0.8]], dtype=np.float32), np.array([-1.5, -2.0]))
    seen, ran = records.trace(np.array([0, 1]), np.array([1, 0]))  # row 1 started this step
    assert ran.tolist() == [[-1.0, -1.5], [0.0, -2.0]]  # row 1's own: its last entry only
    assert seen is not None and seen[0].tolist() == [[0, 1], [0.5, 0.5]]
    assert seen[1, -1].tolist() == [np.float32(0.2), np.float32(0.8)]


def test_rows_moved_between_steps_keep_their_parents() -> None:
    records = StepRecords()
    records.begin(None, np.array([0.0, -1.0, -2.0]))
    records.end(np.array([2, 1, 0]), longest=9)
    records.moved(np.array([2, 3]), count=4)  # two rows left; the one that joined since stays
    records.begin(None, np.array([-3.0, -4.0]))
    seen, ran = records.trace(np.array([0]), np.array([1]))
    assert seen is None and ran.tolist() == [[0.0, -3.0]]  # row 0 was row 2, which continued 0


def test_only_the_steps_the_longest_running_sentence_reaches_are_held() -> None:
    records = StepRecords()
    for _ in range(50):
        records.begin(None, np.zeros(2))
        records.end(np.arange(2), longest=3)
    assert records.held == 3
    records.clear()
    assert records.held == 0 and not records.begun
