"""``cdiflow bench history``: what the API, the dashboard, the scrape and the scheduler cost as
the history of runs grows.

A stack runs a few hundred real workflows; their rows are then cloned, set-based, in the
proportions of those runs and spread over a year (``--days``), to each size asked for, with
their tags, the schedule that made a tenth of them and a webhook's delivery of each one's end;
the database is copied at each size but the largest and a stack started on each (``sides``).
Every call a user and the dashboard make is then timed at every size in turn, round after
round (lists by every filter, the webhook's log, stats, task runs), as are the scrape, the
scheduler's tick and a new run, so each size's ratio to the smallest compares times taken
seconds apart; then one open dashboard tab's CPU at each size and, at the largest, the query
plans of the slowest calls and, for every call, the growing tables it reads whole.
"""
