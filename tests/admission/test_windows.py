"""Window arithmetic across DST transitions (seed 000, "Window arithmetic").

Expected instants are written out by hand from the 2026 transitions:

- America/Los_Angeles: PST -8, PDT -7; Mar 8 02:00 -> 03:00 (10:00Z), Nov 1 02:00 -> 01:00 (09:00Z).
- Europe/Berlin: CET +1, CEST +2; Mar 29 02:00 -> 03:00 (01:00Z), Oct 25 03:00 -> 02:00 (01:00Z).
- Australia/Lord_Howe: +10:30, +11; Apr 5 02:00 -> 01:30 (Apr 4 15:00Z),
  Oct 4 02:00 -> 02:30 (Oct 3 15:30Z).
- Pacific/Chatham: +12:45, +13:45; Apr 5 03:45 -> 02:45 (Apr 4 14:00Z),
  Sep 27 02:45 -> 03:45 (Sep 26 14:00Z).
- Asia/Kolkata: +5:30, no DST.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from admission.windows import (
    Window,
    WindowUnavailable,
    current_window,
    describe,
    next_boundary,
    window_start,
    zone_exists,
)
from switchboard.core.zones import ECHOED, not_a_zone, zones

LA = "America/Los_Angeles"
BERLIN = "Europe/Berlin"
LORD_HOWE = "Australia/Lord_Howe"
CHATHAM = "Pacific/Chatham"
KOLKATA = "Asia/Kolkata"


def assert_window(spec: Window, t: datetime, start: datetime, end: datetime) -> None:
    assert current_window(spec, t) == (start, end)
    assert window_start(spec, t) == start
    assert next_boundary(spec, t) == end
    assert window_start(spec, t).tzinfo is UTC
    assert next_boundary(spec, t).tzinfo is UTC


# Starts inside DST gaps


def test_a_start_in_the_spring_gap_resolves_to_the_first_valid_instant() -> None:
    # 02:30 does not exist on Mar 8; the first valid instant after it is 03:00 PDT.
    spec = Window("day", LA, "02:30")
    assert_window(
        spec,
        datetime(2026, 3, 8, 12, 0, tzinfo=UTC),
        datetime(2026, 3, 8, 10, 0, tzinfo=UTC),
        datetime(2026, 3, 9, 9, 30, tzinfo=UTC),
    )


def test_the_window_before_a_gap_start_ends_at_the_transition() -> None:
    spec = Window("day", LA, "02:30")
    assert_window(
        spec,
        datetime(2026, 3, 8, 9, 59, tzinfo=UTC),
        datetime(2026, 3, 7, 10, 30, tzinfo=UTC),
        datetime(2026, 3, 8, 10, 0, tzinfo=UTC),
    )


def test_a_berlin_start_in_the_march_gap_resolves_to_three_oclock_summer_time() -> None:
    spec = Window("day", BERLIN, "02:30")
    assert_window(
        spec,
        datetime(2026, 3, 29, 6, 0, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
        datetime(2026, 3, 30, 0, 30, tzinfo=UTC),
    )
    assert_window(
        spec,
        datetime(2026, 3, 29, 0, 59, tzinfo=UTC),
        datetime(2026, 3, 28, 1, 30, tzinfo=UTC),
        datetime(2026, 3, 29, 1, 0, tzinfo=UTC),
    )


def test_a_lord_howe_start_in_the_half_hour_gap_resolves_to_half_past_two() -> None:
    # Clocks go from 02:00 to 02:30 on Oct 4; 02:15 becomes 02:30 +11 (Oct 3 15:30Z).
    spec = Window("day", LORD_HOWE, "02:15")
    assert_window(
        spec,
        datetime(2026, 10, 3, 16, 0, tzinfo=UTC),
        datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
        datetime(2026, 10, 4, 15, 15, tzinfo=UTC),
    )
    assert_window(
        spec,
        datetime(2026, 10, 3, 15, 29, tzinfo=UTC),
        datetime(2026, 10, 2, 15, 45, tzinfo=UTC),
        datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
    )


def test_a_chatham_start_in_the_gap_resolves_to_the_transition() -> None:
    # 03:00 on Sep 27 falls in the gap 02:45 -> 03:45.
    spec = Window("day", CHATHAM, "03:00")
    assert_window(
        spec,
        datetime(2026, 9, 27, 0, 0, tzinfo=UTC),
        datetime(2026, 9, 26, 14, 0, tzinfo=UTC),
        datetime(2026, 9, 27, 13, 15, tzinfo=UTC),
    )


# Starts inside DST overlaps


def test_a_start_in_the_fall_back_overlap_resolves_to_the_first_occurrence() -> None:
    # 01:30 happens twice on Nov 1; the first is 01:30 PDT (08:30Z). 09:45Z is the second 01:45.
    spec = Window("day", LA, "01:30")
    assert_window(
        spec,
        datetime(2026, 11, 1, 9, 45, tzinfo=UTC),
        datetime(2026, 11, 1, 8, 30, tzinfo=UTC),
        datetime(2026, 11, 2, 9, 30, tzinfo=UTC),
    )


def test_a_berlin_start_in_the_october_overlap_resolves_to_summer_time() -> None:
    spec = Window("day", BERLIN, "02:30")
    assert_window(
        spec,
        datetime(2026, 10, 25, 1, 15, tzinfo=UTC),
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 26, 1, 30, tzinfo=UTC),
    )
    assert_window(
        spec,
        datetime(2026, 10, 25, 0, 29, tzinfo=UTC),
        datetime(2026, 10, 24, 0, 30, tzinfo=UTC),
        datetime(2026, 10, 25, 0, 30, tzinfo=UTC),
    )


def test_a_lord_howe_start_in_the_half_hour_overlap_resolves_to_the_first_occurrence() -> None:
    # 01:45 on Apr 5 happens at +11 (Apr 4 14:45Z) and again at +10:30 (15:15Z).
    spec = Window("day", LORD_HOWE, "01:45")
    assert_window(
        spec,
        datetime(2026, 4, 4, 15, 10, tzinfo=UTC),
        datetime(2026, 4, 4, 14, 45, tzinfo=UTC),
        datetime(2026, 4, 5, 15, 15, tzinfo=UTC),
    )


def test_a_second_occurrence_instant_given_in_local_time_is_placed_correctly() -> None:
    t = datetime(2026, 11, 1, 1, 45, fold=1, tzinfo=ZoneInfo(LA))  # 09:45Z
    assert_window(
        Window("day", LA, "01:30"),
        t,
        datetime(2026, 11, 1, 8, 30, tzinfo=UTC),
        datetime(2026, 11, 2, 9, 30, tzinfo=UTC),
    )


# Days and weeks that hold a transition are one window


def test_a_fall_back_day_is_one_window_of_twenty_five_hours() -> None:
    start, end = current_window(Window("day", LA, "00:00"), datetime(2026, 11, 1, 12, tzinfo=UTC))
    assert (start, end) == (
        datetime(2026, 11, 1, 7, 0, tzinfo=UTC),
        datetime(2026, 11, 2, 8, 0, tzinfo=UTC),
    )
    assert end - start == timedelta(hours=25)


def test_a_spring_forward_day_is_one_window_of_twenty_three_hours() -> None:
    start, end = current_window(Window("day", LA, "00:00"), datetime(2026, 3, 8, 19, tzinfo=UTC))
    assert (start, end) == (
        datetime(2026, 3, 8, 8, 0, tzinfo=UTC),
        datetime(2026, 3, 9, 7, 0, tzinfo=UTC),
    )
    assert end - start == timedelta(hours=23)


def test_a_berlin_spring_forward_day_is_twenty_three_hours() -> None:
    assert_window(
        Window("day", BERLIN, "00:00"),
        datetime(2026, 3, 29, 12, 0, tzinfo=UTC),
        datetime(2026, 3, 28, 23, 0, tzinfo=UTC),
        datetime(2026, 3, 29, 22, 0, tzinfo=UTC),
    )


def test_a_week_that_holds_the_spring_transition_is_an_hour_short() -> None:
    start, end = current_window(
        Window("week", LA, "09:00", "Mon"), datetime(2026, 3, 8, 12, tzinfo=UTC)
    )
    assert (start, end) == (
        datetime(2026, 3, 2, 17, 0, tzinfo=UTC),
        datetime(2026, 3, 9, 16, 0, tzinfo=UTC),
    )
    assert end - start == timedelta(hours=167)


def test_a_week_that_holds_the_autumn_transition_is_an_hour_long() -> None:
    start, end = current_window(
        Window("week", BERLIN, "09:00", "Mon"), datetime(2026, 10, 25, 12, tzinfo=UTC)
    )
    assert (start, end) == (
        datetime(2026, 10, 19, 7, 0, tzinfo=UTC),
        datetime(2026, 10, 26, 8, 0, tzinfo=UTC),
    )
    assert end - start == timedelta(hours=169)


def test_a_week_start_in_the_spring_gap_resolves_to_the_transition() -> None:
    assert_window(
        Window("week", LA, "02:30", "Sun"),
        datetime(2026, 3, 10, 0, 0, tzinfo=UTC),
        datetime(2026, 3, 8, 10, 0, tzinfo=UTC),
        datetime(2026, 3, 15, 9, 30, tzinfo=UTC),
    )


def test_a_utc_week_runs_from_monday_to_monday() -> None:
    # May 10, 2026 is a Sunday.
    assert_window(
        Window("week", "UTC", "00:00", "Mon"),
        datetime(2026, 5, 10, 12, 0, tzinfo=UTC),
        datetime(2026, 5, 4, 0, 0, tzinfo=UTC),
        datetime(2026, 5, 11, 0, 0, tzinfo=UTC),
    )


def test_a_week_boundary_instant_starts_the_next_week() -> None:
    assert_window(
        Window("week", "UTC", "00:00", "Mon"),
        datetime(2026, 5, 11, 0, 0, tzinfo=UTC),
        datetime(2026, 5, 11, 0, 0, tzinfo=UTC),
        datetime(2026, 5, 18, 0, 0, tzinfo=UTC),
    )


# Hourly windows


def test_an_hourly_window_holding_the_fall_back_overlap_is_two_hours() -> None:
    # Local 01:30 occurs twice; only its first occurrence (08:30Z) is a boundary.
    spec = Window("hour", LA, "00:30")
    for t in (datetime(2026, 11, 1, 8, 45, tzinfo=UTC), datetime(2026, 11, 1, 9, 45, tzinfo=UTC)):
        assert_window(
            spec,
            t,
            datetime(2026, 11, 1, 8, 30, tzinfo=UTC),
            datetime(2026, 11, 1, 10, 30, tzinfo=UTC),
        )


def test_an_hourly_boundary_in_the_spring_gap_moves_to_the_transition() -> None:
    spec = Window("hour", LA, "00:30")
    assert_window(
        spec,
        datetime(2026, 3, 8, 9, 50, tzinfo=UTC),
        datetime(2026, 3, 8, 9, 30, tzinfo=UTC),
        datetime(2026, 3, 8, 10, 0, tzinfo=UTC),
    )
    assert_window(
        spec,
        datetime(2026, 3, 8, 10, 0, tzinfo=UTC),
        datetime(2026, 3, 8, 10, 0, tzinfo=UTC),
        datetime(2026, 3, 8, 10, 30, tzinfo=UTC),
    )


def test_the_hour_part_of_an_hourly_start_is_ignored() -> None:
    t = datetime(2026, 5, 10, 12, 0, tzinfo=UTC)
    expected = (
        datetime(2026, 5, 10, 11, 15, tzinfo=UTC),
        datetime(2026, 5, 10, 12, 15, tzinfo=UTC),
    )
    assert current_window(Window("hour", "UTC", "07:15"), t) == expected
    assert current_window(Window("hour", "UTC", "00:15"), t) == expected


def test_an_hourly_window_at_the_top_of_the_hour_in_kolkata_starts_at_half_past_utc() -> None:
    # 12:00Z is 17:30 in Kolkata; the local hour 17:00-18:00 is 11:30Z-12:30Z.
    assert_window(
        Window("hour", KOLKATA, "00:00"),
        datetime(2026, 5, 10, 12, 0, tzinfo=UTC),
        datetime(2026, 5, 10, 11, 30, tzinfo=UTC),
        datetime(2026, 5, 10, 12, 30, tzinfo=UTC),
    )


def test_an_hourly_window_at_a_quarter_to_in_kolkata_starts_at_a_quarter_past_utc() -> None:
    assert_window(
        Window("hour", KOLKATA, "00:45"),
        datetime(2026, 5, 10, 12, 0, tzinfo=UTC),
        datetime(2026, 5, 10, 11, 15, tzinfo=UTC),
        datetime(2026, 5, 10, 12, 15, tzinfo=UTC),
    )


def test_a_kolkata_day_starts_at_half_past_six_utc_the_day_before() -> None:
    assert_window(
        Window("day", KOLKATA, "00:00"),
        datetime(2026, 5, 10, 12, 0, tzinfo=UTC),
        datetime(2026, 5, 9, 18, 30, tzinfo=UTC),
        datetime(2026, 5, 10, 18, 30, tzinfo=UTC),
    )


def test_chatham_hourly_windows_start_at_a_quarter_past_utc_in_both_seasons() -> None:
    spec = Window("hour", CHATHAM, "00:00")
    # July, +12:45: 00:00Z is 12:45 local, in the local hour 12:00-13:00.
    assert_window(
        spec,
        datetime(2026, 7, 1, 0, 0, tzinfo=UTC),
        datetime(2026, 6, 30, 23, 15, tzinfo=UTC),
        datetime(2026, 7, 1, 0, 15, tzinfo=UTC),
    )
    # January, +13:45: 00:00Z is 13:45 local, in the local hour 13:00-14:00.
    assert_window(
        spec,
        datetime(2026, 1, 15, 0, 0, tzinfo=UTC),
        datetime(2026, 1, 14, 23, 15, tzinfo=UTC),
        datetime(2026, 1, 15, 0, 15, tzinfo=UTC),
    )


def test_a_chatham_hourly_boundary_in_the_gap_leaves_a_quarter_hour_window() -> None:
    # Local 03:00 is in the gap, so it moves to 14:00Z; local 04:00 (+13:45) is 14:15Z.
    spec = Window("hour", CHATHAM, "00:00")
    assert_window(
        spec,
        datetime(2026, 9, 26, 13, 59, tzinfo=UTC),
        datetime(2026, 9, 26, 13, 15, tzinfo=UTC),
        datetime(2026, 9, 26, 14, 0, tzinfo=UTC),
    )
    assert_window(
        spec,
        datetime(2026, 9, 26, 14, 5, tzinfo=UTC),
        datetime(2026, 9, 26, 14, 0, tzinfo=UTC),
        datetime(2026, 9, 26, 14, 15, tzinfo=UTC),
    )


def test_lord_howe_hourly_windows_bend_around_both_half_hour_shifts() -> None:
    spec = Window("hour", LORD_HOWE, "00:00")
    # Spring: 01:00 +10:30 is 14:30Z, 02:00 is in the gap (15:30Z), 03:00 +11 is 16:00Z.
    assert_window(
        spec,
        datetime(2026, 10, 3, 15, 0, tzinfo=UTC),
        datetime(2026, 10, 3, 14, 30, tzinfo=UTC),
        datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
    )
    assert_window(
        spec,
        datetime(2026, 10, 3, 15, 45, tzinfo=UTC),
        datetime(2026, 10, 3, 15, 30, tzinfo=UTC),
        datetime(2026, 10, 3, 16, 0, tzinfo=UTC),
    )
    # Autumn: 01:00 +11 is 14:00Z and 02:00 +10:30 is 15:30Z, a 90-minute window.
    assert_window(
        spec,
        datetime(2026, 4, 4, 15, 10, tzinfo=UTC),
        datetime(2026, 4, 4, 14, 0, tzinfo=UTC),
        datetime(2026, 4, 4, 15, 30, tzinfo=UTC),
    )


def test_an_instant_on_a_boundary_belongs_to_the_window_it_starts() -> None:
    assert_window(
        Window("hour", "UTC", "00:15"),
        datetime(2026, 5, 10, 12, 15, tzinfo=UTC),
        datetime(2026, 5, 10, 12, 15, tzinfo=UTC),
        datetime(2026, 5, 10, 13, 15, tzinfo=UTC),
    )


def test_a_utc_day_ignores_a_stray_weekday() -> None:
    assert_window(
        Window("day", "UTC", "06:00", "Tue"),
        datetime(2026, 5, 10, 5, 59, 59, 999999, tzinfo=UTC),
        datetime(2026, 5, 9, 6, 0, tzinfo=UTC),
        datetime(2026, 5, 10, 6, 0, tzinfo=UTC),
    )


# Specs that cannot be evaluated


@pytest.mark.parametrize(
    "spec",
    [
        Window("day", "Mars/Olympus", "00:00"),
        Window("day", "", "00:00"),
        Window("day", "../etc", "00:00"),
        Window("day", "localtime", "00:00"),
        Window("day", "America", "00:00"),
        Window("day", "america/los_angeles", "00:00"),
        Window("day", "UTC", "24:00"),
        Window("day", "UTC", "7:00"),
        Window("day", "UTC", "07:60"),
        Window("day", "UTC", "07:00\n"),
        Window("week", "UTC", "00:00"),
        Window("week", "UTC", "00:00", "Monday"),
        Window("month", "UTC", "00:00"),
        Window(None, "UTC", "00:00"),
        Window("day", None, "00:00"),
        Window("day", "UTC", None),
    ],
    ids=repr,
)
def test_a_spec_that_cannot_be_evaluated_raises_window_unavailable(spec: Window) -> None:
    t = datetime(2026, 5, 10, 12, 0, tzinfo=UTC)
    with pytest.raises(WindowUnavailable):
        current_window(spec, t)
    with pytest.raises(WindowUnavailable):
        window_start(spec, t)
    with pytest.raises(WindowUnavailable):
        next_boundary(spec, t)


def test_a_naive_instant_is_refused() -> None:
    with pytest.raises(ValueError, match="aware"):
        window_start(Window("day", "UTC", "00:00"), datetime(2026, 5, 10, 12, 0))


@pytest.mark.parametrize("name", ["UTC", LA, BERLIN, LORD_HOWE, CHATHAM, KOLKATA])
def test_a_real_zone_exists(name: str) -> None:
    assert zone_exists(name)


@pytest.mark.parametrize(
    "name",
    ["", "../etc", "/etc/localtime", "local", "localtime", "Mars/Olympus", "America", "utc "],
)
def test_a_made_up_or_host_dependent_zone_does_not_exist(name: str) -> None:
    assert not zone_exists(name)


@pytest.mark.parametrize(
    ("spec", "text"),
    [
        (Window("day", LA, "00:00"), "per day from 00:00 America/Los_Angeles"),
        (Window("week", BERLIN, "09:00", "Mon"), "per week from Mon 09:00 Europe/Berlin"),
        (Window("hour", "UTC", "07:15"), "per hour from :15 UTC"),
    ],
)
def test_describe_says_the_window_in_a_short_phrase(spec: Window, text: str) -> None:
    assert describe(spec) == text


# Properties

ZONES = [
    "UTC",
    LA,
    BERLIN,
    LORD_HOWE,
    CHATHAM,
    KOLKATA,
    "America/St_Johns",  # -3:30 / -2:30
    "Asia/Kathmandu",  # +5:45
    "Europe/London",
    "Australia/Adelaide",  # +9:30 / +10:30, southern hemisphere
    "America/Santiago",
    "Africa/Casablanca",  # offset changes around Ramadan
    "Antarctica/Troll",  # a two-hour DST shift
    "Pacific/Apia",
]

specs = st.builds(
    Window,
    st.sampled_from(["hour", "day", "week"]),
    st.sampled_from(ZONES),
    st.builds(lambda h, m: f"{h:02d}:{m:02d}", st.integers(0, 23), st.integers(0, 59)),
    st.sampled_from(["Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun"]),
)
instants = st.datetimes(
    min_value=datetime(2020, 1, 1),
    max_value=datetime(2035, 12, 31, 23, 59, 59),
    timezones=st.sampled_from([UTC, *(ZoneInfo(name) for name in ZONES[1:])]),
)


@settings(max_examples=300, deadline=None)
@given(spec=specs, t=instants)
def test_windows_tile_time_around_any_instant(spec: Window, t: datetime) -> None:
    start, end = current_window(spec, t)
    assert start <= t < end
    assert start < end
    assert window_start(spec, t) == start
    assert next_boundary(spec, t) == end
    assert window_start(spec, start) == start
    assert window_start(spec, end) == end
    assert next_boundary(spec, start) == end
    assert window_start(spec, end - timedelta(microseconds=1)) == start


@settings(max_examples=300, deadline=None)
@given(spec=specs, t=instants)
def test_every_boundary_is_at_the_declared_wall_time_or_at_the_end_of_a_gap(
    spec: Window, t: datetime
) -> None:
    zone = ZoneInfo(spec.window_tz or "")
    hour, minute = (int(part) for part in (spec.window_start or "").split(":"))
    for boundary in current_window(spec, t):
        local = boundary.astimezone(zone)
        at_declared_time = local.minute == minute and (
            spec.window_period == "hour"
            or (
                local.hour == hour
                and (spec.window_period == "day" or local.strftime("%a") == spec.window_weekday)
            )
        )
        just_before = (boundary - timedelta(seconds=1)).astimezone(zone)
        at_transition = just_before.utcoffset() != local.utcoffset()
        assert at_declared_time or at_transition


@pytest.mark.parametrize(
    ("name", "meant"),
    [
        ("europe/berlin", "Europe/Berlin"),
        ("America/New York", "America/New_York"),
        (" utc ", "UTC"),
        ("Europe/Berlin ", "Europe/Berlin"),
        ("Mars/Olympus", None),
    ],
)
def test_a_refused_zone_names_the_zone_it_was_likely_meant_to_be(
    name: str, meant: str | None
) -> None:
    # IANA names are case sensitive and spelt with underscores; the refusal says which zone a
    # near miss meant, and suggests nothing for a name that is not near one.
    assert not zone_exists(name)
    said = not_a_zone(name)
    assert said.startswith(f"{name!r} is not a known IANA time zone")
    assert said.endswith(f" (did you mean {meant!r}?)" if meant else "time zone")


def test_a_refused_zone_name_of_any_length_is_repeated_in_a_line() -> None:
    # A 10,000-character zone typed in the budget form was repeated whole, twice on the page.
    assert max(len(z) for z in zones()) < ECHOED
    said = not_a_zone("x" * 10_000)
    assert said == f"{'x' * ECHOED!r}… (10000 characters) is not a known IANA time zone"
