-- Quickstart: embed 1,000 fortunes (examples/data/fortunes.jsonl) into a Lance dataset.
-- Run from the repository root:  pipeline run sql/quickstart.sql
SET embed.model = 'models/all-MiniLM-L6-v2';

CREATE EXTERNAL TABLE docs STORED AS JSON LOCATION 'examples/data/fortunes.jsonl';

-- A look at three vectors before the campaign.
SELECT id, embed(text) AS embedding FROM docs LIMIT 3;

-- The campaign: one vector per document, keyed by the source id. A rerun embeds only the ids not yet
-- written (none, once this has finished), so it writes nothing new.
COPY (SELECT id, embed(text) AS embedding FROM docs) TO 'out/quickstart.lance' STORED AS LANCE;

-- Read the vectors back and join them to their source rows.
CREATE EXTERNAL TABLE emb STORED AS LANCE LOCATION 'out/quickstart.lance';
SELECT d.id, substr(d.text, 1, 40) AS text, e.embedding
FROM docs d JOIN emb e USING (id)
ORDER BY d.id
LIMIT 3;
