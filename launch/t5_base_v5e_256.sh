#!/usr/bin/env bash
# T5.1.1-base pretraining on C4 (span corruption, inputs 512 / targets 114, batch 128, the
# paper's 2^19 steps) on one v5e-256 spot slice. Preemptions are recovered by `t2t launch`:
# it re-creates the slice and reruns the command, which resumes from the last checkpoint in
# the bucket.
#
#   BUCKET=my-bucket ZONE=us-west4-a PROJECT=my-project launch/t5_base_v5e_256.sh [--dry-run]
#
# Before the first run: C4 prepared with TFDS in gs://$BUCKET/tfds (c4/en:3.1.0), and T5's
# SentencePiece model copied into this checkout (it is shipped to the workers with it):
#   gsutil cp gs://t5-data/vocabs/cc_all.32000/sentencepiece.model vocabs/t5_cc_all_32000.model
set -euo pipefail
: "${BUCKET:?set BUCKET to the name of a gs:// bucket for data and checkpoints}"
: "${ZONE:?set ZONE to a zone with v5e capacity, e.g. us-west4-a}"
cd "$(dirname "$0")/.."

exec t2t launch tpu --name "${NAME:-t5-base}" --zone "$ZONE" ${PROJECT:+--project "$PROJECT"} \
    --accelerator v5e-256 --spot "$@" -- \
    env TFDS_DATA_DIR="gs://$BUCKET/tfds" \
    t2t train \
    --gin_file=models/t5/1_1/base.gin \
    --gin_file=objectives/span_3_15_u_u.gin \
    --gin_file=runs/pretrain.gin \
    --gin_file=hardware/tpu_v5e_256.gin \
    --gin.CORPUS=c4 \
    --gin.t5_vocabulary.path=vocabs/t5_cc_all_32000.model \
    "--gin.TASK_FEATURE_LENGTHS={'inputs': 512, 'targets': 114}" \
    --gin.BATCH_SIZE=128 \
    --gin.TRAIN_STEPS=524288 \
    --gin.MODEL_DIR="gs://$BUCKET/runs/t5_1_1_base"
