"""``cdiflow bench history``: what the API, the dashboard, the scrape and the scheduler cost as
the history of runs grows.

A stack runs a few hundred real workflows; their rows are then cloned, set-based, in the
proportions of those runs and spread over a year (``--days``), to each size asked for, with
their tags, the schedule that made a tenth of them and a webhook's delivery of each one's end;
at each size every call a user and the dashboard make is timed (lists by every filter, the
webhook's log, stats, task runs), as are the scrape, the scheduler's tick, a new run and one
open dashboard tab's CPU; at the largest, the query plans of the slowest calls and, for every
call, the growing tables it reads whole.
"""
