"""One click command (or group) per module; builder.cli registers them."""
