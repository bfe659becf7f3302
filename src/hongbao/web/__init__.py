"""The web app served by `hongbao serve`: the red-packet page, live updates, the dashboard.

See `hongbao.web.routes` for the endpoints; the page itself is plain HTML, CSS and
JavaScript in ``static/`` (no build step, nothing from a CDN).
"""
