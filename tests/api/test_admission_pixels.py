"""The device's pixel budget (api/admission.py): contention is a 429 to retry, a request that alone
passes the budget is a 413 for good (a retry could never succeed)."""

from __future__ import annotations

import pytest

from edge_runtime.api.admission import Admission
from edge_runtime.api.errors import ApiError

MP = 1_000_000


def test_a_request_whose_own_images_pass_the_budget_is_a_413_not_a_retry() -> None:
    gate = Admission(max_requests=4, max_pixels=50 * MP)
    with gate.admitted() as ticket:
        for k in range(5):
            ticket.reserve_pixels(3000, 3000, f"messages.0.content.{k}.image_url.url")  # 45 MP so far
        with pytest.raises(ApiError) as refused:
            ticket.reserve_pixels(3000, 3000, "messages.0.content.5.image_url.url")
    assert refused.value.status == 413 and "Retry-After" not in refused.value.headers
    assert refused.value.field == "messages.0.content.5.image_url.url"
    assert "images.max_pixels" in refused.value.message
    assert gate.pixels == 0 and gate.in_flight == 0  # the refused request gave its share back


def test_pixels_other_requests_are_decoding_make_a_429_with_retry_after() -> None:
    gate = Admission(max_requests=4, max_pixels=50 * MP)
    with gate.admitted() as first:
        first.reserve_pixels(6000, 7000, "image")  # 42 MP of another request
        with gate.admitted() as second, pytest.raises(ApiError) as busy:
            second.reserve_pixels(3000, 3000, "messages.0.content.0.image_url.url")
    assert busy.value.status == 429 and busy.value.headers["Retry-After"]


def test_one_image_alone_always_fits() -> None:
    gate = Admission(max_requests=4, max_pixels=50 * MP)
    with gate.admitted() as ticket:
        ticket.reserve_pixels(10000, 6000, "image")  # 60 MP: its own limit is the decoder's to check
        assert gate.pixels == 60 * MP
