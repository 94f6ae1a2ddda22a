"""Conventions both services implement once: the error model, input checks,
SQLite durability settings, watch fan-out, clocks and server bootstrap.

Everything here is domain-free; neither service imports the other, and their only
other shared code is the generated contract next to this package.
"""
