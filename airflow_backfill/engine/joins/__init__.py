"""Joins: MVs over several upstreams, with a watermark per upstream.

`watermarks` keeps the vector watermark (one upstream version per upstream) atomic with
the MV's data; `relation` reads the upstreams as of their versions and walks the join
tree; `delta_rule` turns a round's change feeds into signed rows of the join; `apply`
commits a round, `snapshot` the first build, and `rounds` lets catch-up and forward run
a join's rounds as they run one upstream's. See docs/joins.md.
"""
