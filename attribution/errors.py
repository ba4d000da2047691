"""The one exception type for mistakes a user can make."""


class AttributionError(ValueError):
    """A problem with the user's model, data or arguments; the message says what to do."""
