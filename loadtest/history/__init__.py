"""``cdiflow bench history``: what the API, the dashboard, the scrape and the scheduler cost as
the history of runs grows.

A stack runs a few hundred real workflows; their rows are then cloned, set-based, in the
proportions of those runs and spread over 30 days, to each size asked for; at each size every
call a user and the dashboard make is timed, as are the scrape, the scheduler's tick, a new
run and one open dashboard tab's CPU, with the query plans of the slowest calls.
"""
