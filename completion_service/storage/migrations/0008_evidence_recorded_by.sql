-- Every evidence fact records the authenticated caller that recorded it (the
-- dashboard shows who vouched for what); facts stored before have none ('').
ALTER TABLE evidence ADD COLUMN caller_subject TEXT NOT NULL DEFAULT '';
ALTER TABLE evidence ADD COLUMN caller_role TEXT NOT NULL DEFAULT '';
