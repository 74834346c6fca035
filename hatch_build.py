"""The wheel's build hook (hatchling's `custom` hook): what the wheel carries beside the
package, mapped into it: the SQL files (sql/ as pagedkv_sql/sql), the README's data (data/
as pagedkv_sql/example) and the pytest plugin (pytest_pagedkv.py, a module of its own).

An editable install gets none of them: it puts the checkout on sys.path, where the package
finds sql/ and data/ beside itself and pytest loads the checkout's pytest_pagedkv.py. A copy
in site-packages would be loaded instead of the file a developer edits."""

from __future__ import annotations

from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

BESIDE = {
    "sql": "pagedkv_sql/sql",
    "data": "pagedkv_sql/example",
    "pytest_pagedkv.py": "pytest_pagedkv.py",
}


class CustomBuildHook(BuildHookInterface):
    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name == "wheel" and version != "editable":
            build_data["force_include"].update(BESIDE)
