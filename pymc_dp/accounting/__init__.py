"""Privacy accounting (SPEC §3). Filled in by the accounting issue."""
