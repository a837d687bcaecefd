"""The standard Server-Timing header, as the FastAPI services send it."""

import pytest

from servelab.measure.server_timing import TimingSums, parse_server_timing


def test_parses_the_services_header() -> None:
    t = parse_server_timing("queue;dur=1.2, preprocess;dur=3.4, infer;dur=8, total;dur=12.9")
    assert t.durations_ms == {"queue": 1.2, "preprocess": 3.4, "infer": 8.0, "total": 12.9}


def test_tolerates_the_full_syntax_and_junk() -> None:
    t = parse_server_timing('cache;desc="Cache Read";dur=23.2, db;dur=53 , app ;DUR=47.2, batch;desc=4, '
                            'miss, bad;dur=abc,, ;dur=1')
    assert t.durations_ms == {"cache": 23.2, "db": 53.0, "app": 47.2}
    assert t.descriptions == {"cache": "Cache Read", "batch": "4"}
    assert parse_server_timing(None).durations_ms == {}
    assert parse_server_timing("").durations_ms == {}


def test_means_over_a_run_split_queue_from_service() -> None:
    sums = TimingSums()
    for queue, pre, infer in ((0.0, 2.0, 10.0), (4.0, 2.0, 10.0), (8.0, 2.0, 10.0)):
        sums.add(parse_server_timing(f"queue;dur={queue}, preprocess;dur={pre}, infer;dur={infer}, "
                                     f"total;dur={queue + pre + infer}"))
    b = sums.breakdown()
    assert b.source == "server-timing" and b.server_requests == 3
    assert b.queue_ms == pytest.approx(4.0)
    assert b.service_ms == pytest.approx(12.0)
    assert b.parts_ms["total"] == pytest.approx(16.0)
    assert b.queue_share == pytest.approx(4 / 16)
    assert b.batch_sizes == {} and b.mean_batch_size is None


def test_batch_size_tags_give_the_server_batch_histogram() -> None:
    sums = TimingSums()
    for size in [1, 1] + [4] * 8:  # two solo executions, two batches of four
        sums.add(parse_server_timing(f"infer;dur=5, batch;desc={size}"))
    b = sums.breakdown()
    assert b.batch_sizes == {1: 2, 4: 2}
    assert b.mean_batch_size == pytest.approx(10 / 4)


def test_batch_histogram_counts_images_of_multi_image_requests() -> None:
    sums = TimingSums(images_per_request=2)
    for size in [2, 2] + [8] * 4:  # two solo 2-image requests, one inference of four such requests
        sums.add(parse_server_timing(f"infer;dur=5, batch;desc={size}"))
    b = sums.breakdown()
    assert b.batch_sizes == {2: 2, 8: 1}
    assert b.mean_batch_size == pytest.approx(12 / 3)


def test_no_header_no_breakdown() -> None:
    assert TimingSums().breakdown() is None
