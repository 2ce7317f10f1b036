//! One Arrow record batch as the bytes of a Parquet file: how every table
//! the project writes whole (chunk table, saliency, eval summary, score
//! table) is encoded.

use arrow::array::RecordBatch;
use parquet::arrow::ArrowWriter;

/// The Parquet file of `batch` alone (its own schema, default properties).
pub fn parquet_bytes(batch: &RecordBatch) -> Result<Vec<u8>, String> {
    let mut out = Vec::new();
    let mut w = ArrowWriter::try_new(&mut out, batch.schema(), None).map_err(|e| e.to_string())?;
    w.write(batch).map_err(|e| e.to_string())?;
    w.close().map_err(|e| e.to_string())?;
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{ArrayRef, UInt32Array};
    use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    use std::sync::Arc;

    #[test]
    fn a_batch_reads_back_from_its_bytes() {
        let col: ArrayRef = Arc::new(UInt32Array::from(vec![3, 1, 4]));
        let batch = RecordBatch::try_from_iter([("x", col)]).unwrap();
        let bytes = parquet_bytes(&batch).unwrap();
        let back: Vec<RecordBatch> =
            ParquetRecordBatchReaderBuilder::try_new(bytes::Bytes::from(bytes))
                .unwrap()
                .build()
                .unwrap()
                .collect::<Result<_, _>>()
                .unwrap();
        assert_eq!(back, vec![batch]);
    }
}
