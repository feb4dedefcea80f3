"""The plugin's page: a React app that Airflow's own UI loads and renders in its frame.

Airflow 3.3's UI loads a plugin's `react_apps` bundle as an ES module and renders the
component it registers (`globalThis.AirflowPlugin`). It shares its React, React Router
and Chakra UI (with its theme, light and dark) through `globalThis`, so the page is
written against those in plain JavaScript: no build step, no package from a JavaScript
registry, and it looks like the rest of the UI. Values reach the page as React text,
never as markup.
"""

from __future__ import annotations

from pathlib import Path

PAGE_SCRIPT = Path(__file__).with_name("static") / "backfill_progress.js"
"""The React app; served by the plugin's app at `/airflow-backfill/static/backfill_progress.js`."""
