"""`funnel`: run both services locally, walk a task through the story, and move
transcripts in and out as JSONL."""
