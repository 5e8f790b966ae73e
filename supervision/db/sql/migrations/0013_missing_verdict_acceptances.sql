-- Missing verdicts accepted by an operator (issue #25, `safetynet accept-missing`).
-- recording-finalize gives a Missing (Failed/Timeout) verdict only with evidence that its
-- 404s mean "not uploaded": a known recording found, a recording-named key listed under
-- the prefix, or an object found by a HEAD of the same cycle. Without any, the verdicts
-- are withheld (rows given back untouched) until evidence appears — or until an operator,
-- having checked that the incident is genuine (nothing was ever uploaded there), accepts
-- them for this bucket and prefix until accepted_until. Bound to the location it was
-- given for: a later change of s3.bucket or s3.key_prefix is not covered by it.
CREATE TABLE safetynet.missing_verdict_acceptances (
    bucket text CHECK (char_length(bucket) <= 256) NOT NULL,
    key_prefix text CHECK (char_length(key_prefix) <= 1024) NOT NULL,
    reason text CHECK (char_length(reason) <= 512) NOT NULL,
    accepted_at timestamptz NOT NULL,
    accepted_until timestamptz NOT NULL,
    accepted_by text CHECK (char_length(accepted_by) <= 256) NOT NULL,
    PRIMARY KEY (bucket, key_prefix),
    CHECK (accepted_until > accepted_at)
);
