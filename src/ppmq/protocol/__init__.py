"""Wire formats, pure: ppmq's JSON requests, replies and batches, their framing, and PHPMQ's codec."""
