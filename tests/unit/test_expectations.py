"""The provisioning controller's named bookkeeping: VolumeExpectations and ClaimProtection."""

from __future__ import annotations

from pyprovlib.controller._provision.expectations import VolumeExpectations
from pyprovlib.controller._provision.protection import FINALIZER_PROVISIONING, ClaimProtection


def volume(name: str, uid: str) -> dict[str, object]:
    return {"metadata": {"name": name, "uid": uid}}


def claim(uid: str, *, finalizer: bool = False, deleting: bool = False) -> dict[str, object]:
    metadata: dict[str, object] = {"name": "c", "namespace": "ns", "uid": uid}
    if finalizer:
        metadata["finalizers"] = [FINALIZER_PROVISIONING]
    if deleting:
        metadata["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    return {"metadata": metadata}


def test_saved_volume_is_expected_until_a_worker_sees_an_event_for_it() -> None:
    expectations = VolumeExpectations()
    expectations.expect_saved("pv-1")
    assert expectations.saved_not_seen("pv-1")
    assert not expectations.saved_not_seen("pv-2")
    expectations.observed("pv-1", volume("pv-1", "u1"))
    assert not expectations.saved_not_seen("pv-1")
    assert len(expectations) == 0


def test_failed_save_is_not_expected() -> None:
    expectations = VolumeExpectations()
    expectations.expect_saved("pv-1")
    expectations.save_failed("pv-1")
    assert not expectations.saved_not_seen("pv-1")


def test_deleted_asset_is_remembered_for_that_pv_until_it_is_gone_or_replaced() -> None:
    expectations = VolumeExpectations()
    old = volume("pv-1", "u1")
    expectations.asset_deleted(old)
    assert expectations.is_asset_deleted(old)
    # An update of the same PV (its deletion racing) keeps the memory.
    expectations.observed("pv-1", old)
    assert expectations.is_asset_deleted(old)
    # A PV recreated under the name is another asset.
    replaced = volume("pv-1", "u2")
    assert not expectations.is_asset_deleted(replaced)
    expectations.observed("pv-1", replaced)
    assert not expectations.is_asset_deleted(old)
    expectations.asset_deleted(old)
    expectations.observed("pv-1", None)
    assert len(expectations) == 0


def test_protection_added_counts_before_the_cache_shows_the_finalizer() -> None:
    protection = ClaimProtection()
    assert not protection.is_protected(claim("u1"))
    assert protection.is_protected(claim("u1", finalizer=True))
    protection.added("u1")
    assert protection.is_protected(claim("u1"))
    protection.released(claim("u1"))
    assert not protection.is_protected(claim("u1"))
    assert not protection.was_cleaned_up("u1")  # not deleting: nothing cleaned up


def test_release_while_bound_is_per_claim() -> None:
    """Issue 20's bug: one claim's pending removal must say nothing about another claim."""
    protection = ClaimProtection()
    protection.mark_released_while_bound("u1")
    assert protection.released_while_bound("u1")
    assert not protection.released_while_bound("u2")
    protection.seen_without_finalizer("u2")
    assert protection.released_while_bound("u1")
    protection.seen_without_finalizer("u1")
    assert not protection.released_while_bound("u1")


def test_cleaned_up_claims_outlive_forget_and_are_bounded() -> None:
    protection = ClaimProtection(remembered=2)
    for uid in ("u1", "u2", "u3"):
        protection.added(uid)
        protection.released(claim(uid, finalizer=True, deleting=True))
    protection.forget("u3")
    assert protection.was_cleaned_up("u3")  # kept past the claim's deletion
    assert protection.was_cleaned_up("u2")
    assert not protection.was_cleaned_up("u1")  # the oldest is dropped


def test_forget_drops_added_and_bound_release() -> None:
    protection = ClaimProtection()
    protection.added("u1")
    protection.mark_released_while_bound("u1")
    protection.forget("u1")
    assert not protection.was_added("u1")
    assert not protection.released_while_bound("u1")
