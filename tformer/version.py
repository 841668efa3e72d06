"""The package version, kept apart so any module can import it without cycles."""

__version__ = "0.1.0"
