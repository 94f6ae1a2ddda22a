-- Each caller (authenticated subject and role) is stored once, and an event names
-- it by number: the subject and role took ~65 bytes of every event, a fifth of a
-- settlement's row (issue 13, "store each thing once"). Events written before
-- this migration keep their text in caller_subject/caller_role (history is not
-- rewritten); later ones leave those empty and set caller_id.
CREATE TABLE callers (
    caller_id INTEGER PRIMARY KEY,
    subject   TEXT    NOT NULL,
    role      TEXT    NOT NULL,
    UNIQUE (subject, role)
);
ALTER TABLE lifecycle_events ADD COLUMN caller_id INTEGER REFERENCES callers (caller_id);
