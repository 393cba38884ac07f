//! The part of XGBoost's C API that [`super::gbdt`] uses, made safe: dense matrices with
//! labels, groups and weights, and boosters that train, predict, save and load.
//!
//! Our own layer over the raw `xgboost_lib-sys` bindings rather than the `xgb` crate: `xgb`
//! enables the bindings' default feature, whose build script downloads a prebuilt library,
//! and a crate that depends on ours could not switch that off (see `build.rs`).
//!
//! Every call returns XGBoost's status: 0 for success, -1 with a message for
//! `XGBGetLastError`. A handle is owned by exactly one value and freed on drop.

use std::ffi::{c_char, CStr, CString};
use std::ptr;

use xgboost_sys::{bst_ulong, BoosterHandle, DMatrixHandle};

use crate::ModelError;

/// XGBoost's message for the last failed call of this thread.
fn last_error() -> ModelError {
    // SAFETY: XGBGetLastError has no precondition; it returns a NUL-terminated string owned by
    // XGBoost (thread-local, valid until the next call), copied here before any other call.
    let message = unsafe { CStr::from_ptr(xgboost_sys::XGBGetLastError()) };
    ModelError::Xgboost(message.to_string_lossy().into_owned())
}

/// Turns a C API status into a result.
fn check(status: i32) -> Result<(), ModelError> {
    if status == 0 {
        Ok(())
    } else {
        Err(last_error())
    }
}

/// A C string for a name or value that we build; an interior NUL is refused, not truncated.
fn c_string(s: &str) -> Result<CString, ModelError> {
    CString::new(s).map_err(|_| ModelError::Xgboost(format!("{s:?} contains a NUL byte")))
}

/// Copies an array XGBoost owns (valid until the next call on its object).
///
/// # Safety
/// `data` must point to `len` readable values, or `len` must be 0.
unsafe fn copy_out<T: Copy>(data: *const T, len: bst_ulong) -> Vec<T> {
    if len == 0 || data.is_null() {
        return Vec::new();
    }
    // SAFETY: the caller guarantees `len` readable values at `data`, which is not null.
    unsafe { std::slice::from_raw_parts(data, len as usize).to_vec() }
}

/// Sets XGBoost's process-wide configuration (a JSON object, e.g. `{"verbosity": 0}`).
pub(crate) fn set_global_config(json: &str) -> Result<(), ModelError> {
    let json = c_string(json)?;
    // SAFETY: a NUL-terminated string that XGBoost only reads during the call.
    check(unsafe { xgboost_sys::XGBSetGlobalConfig(json.as_ptr()) })
}

/// A dense row-major matrix of f32 features (NaN is "missing"), with its training metadata.
pub(crate) struct DMatrix {
    handle: DMatrixHandle,
}

impl DMatrix {
    /// `rows` rows of `data.len() / rows` columns each.
    pub(crate) fn from_dense(data: &[f32], rows: usize) -> Result<DMatrix, ModelError> {
        if rows == 0 || !data.len().is_multiple_of(rows) {
            return Err(ModelError::Xgboost(format!(
                "{} values do not split into {rows} rows",
                data.len()
            )));
        }
        let mut handle = ptr::null_mut();
        // SAFETY: `data` holds rows * cols floats, which XGBoost copies during the call;
        // `handle` receives a new matrix that this value then owns.
        check(unsafe {
            xgboost_sys::XGDMatrixCreateFromMat(
                data.as_ptr(),
                rows as bst_ulong,
                (data.len() / rows) as bst_ulong,
                f32::NAN,
                &mut handle,
            )
        })?;
        Ok(DMatrix { handle })
    }

    fn set_float_info(&mut self, field: &CStr, values: &[f32]) -> Result<(), ModelError> {
        // SAFETY: a live handle, a NUL-terminated field name, and `values.len()` floats that
        // XGBoost copies during the call.
        check(unsafe {
            xgboost_sys::XGDMatrixSetFloatInfo(
                self.handle,
                field.as_ptr(),
                values.as_ptr(),
                values.len() as bst_ulong,
            )
        })
    }

    fn float_info(&self, field: &CStr) -> Result<Vec<f32>, ModelError> {
        let (mut len, mut data) = (0, ptr::null());
        // SAFETY: a live handle and a NUL-terminated field name; XGBoost writes a length and a
        // pointer into storage of the matrix, copied out before the next call.
        check(unsafe {
            xgboost_sys::XGDMatrixGetFloatInfo(self.handle, field.as_ptr(), &mut len, &mut data)
        })?;
        // SAFETY: XGBoost returned `len` floats at `data`.
        Ok(unsafe { copy_out(data, len) })
    }

    /// One label per row.
    pub(crate) fn set_labels(&mut self, labels: &[f32]) -> Result<(), ModelError> {
        self.set_float_info(c"label", labels)
    }

    /// One weight per group (ranking and grouped objectives) or per row.
    pub(crate) fn set_weights(&mut self, weights: &[f32]) -> Result<(), ModelError> {
        self.set_float_info(c"weight", weights)
    }

    /// Sizes of consecutive row groups (they must sum to the number of rows).
    pub(crate) fn set_group(&mut self, sizes: &[u32]) -> Result<(), ModelError> {
        // SAFETY: a live handle, a NUL-terminated field name, and `sizes.len()` values that
        // XGBoost copies during the call.
        check(unsafe {
            xgboost_sys::XGDMatrixSetUIntInfo(
                self.handle,
                c"group".as_ptr(),
                sizes.as_ptr(),
                sizes.len() as bst_ulong,
            )
        })
    }

    /// The labels set by [`DMatrix::set_labels`].
    pub(crate) fn labels(&self) -> Result<Vec<f32>, ModelError> {
        self.float_info(c"label")
    }

    /// The weights set by [`DMatrix::set_weights`] (empty if none).
    pub(crate) fn weights(&self) -> Result<Vec<f32>, ModelError> {
        self.float_info(c"weight")
    }

    /// Group boundaries: `[0, end of group 0, end of group 1, ...]`, one more than groups.
    pub(crate) fn group_bounds(&self) -> Result<Vec<u32>, ModelError> {
        let (mut len, mut data) = (0, ptr::null());
        // SAFETY: as in `float_info`, for XGBoost's unsigned field `group_ptr`.
        check(unsafe {
            xgboost_sys::XGDMatrixGetUIntInfo(
                self.handle,
                c"group_ptr".as_ptr(),
                &mut len,
                &mut data,
            )
        })?;
        // SAFETY: XGBoost returned `len` values at `data`.
        Ok(unsafe { copy_out(data, len) })
    }
}

impl Drop for DMatrix {
    fn drop(&mut self) {
        // SAFETY: the handle was created by XGDMatrixCreateFromMat and is freed once, here.
        // A failure to free cannot be acted on in a destructor.
        let _ = unsafe { xgboost_sys::XGDMatrixFree(self.handle) };
    }
}

/// A custom objective: from the predictions for each row of the training matrix, one
/// gradient and one hessian per row.
pub(crate) type Objective = fn(&[f32], &DMatrix) -> (Vec<f32>, Vec<f32>);

/// A gradient-boosted tree ensemble being trained or used for prediction.
pub(crate) struct Booster {
    handle: BoosterHandle,
}

// SAFETY: a booster is a heap object reached only through its handle, which this value owns
// exclusively; XGBoost's C API allows calls on a booster from any thread, one at a time, and
// `&mut self` on every mutating method (with no `Sync`) keeps them one at a time.
unsafe impl Send for Booster {}

impl Booster {
    /// A new booster whose training caches `cached` (XGBoost keeps its own reference).
    pub(crate) fn new(cached: &[&DMatrix]) -> Result<Booster, ModelError> {
        let handles: Vec<DMatrixHandle> = cached.iter().map(|m| m.handle).collect();
        let mut handle = ptr::null_mut();
        // SAFETY: `handles.len()` live matrix handles; `handle` receives a new booster that
        // this value then owns.
        check(unsafe {
            xgboost_sys::XGBoosterCreate(handles.as_ptr(), handles.len() as bst_ulong, &mut handle)
        })?;
        Ok(Booster { handle })
    }

    /// A booster from a model written by [`Booster::save_json`].
    pub(crate) fn load_json(json: &[u8]) -> Result<Booster, ModelError> {
        let booster = Booster::new(&[])?;
        // SAFETY: a live booster and `json.len()` readable bytes, read during the call.
        check(unsafe {
            xgboost_sys::XGBoosterLoadModelFromBuffer(
                booster.handle,
                json.as_ptr().cast(),
                json.len() as bst_ulong,
            )
        })?;
        Ok(booster)
    }

    /// Sets one training or prediction parameter (XGBoost's names and text values).
    pub(crate) fn set_param(&mut self, name: &str, value: &str) -> Result<(), ModelError> {
        let (name, value) = (c_string(name)?, c_string(value)?);
        // SAFETY: a live booster and two NUL-terminated strings read during the call.
        check(unsafe { xgboost_sys::XGBoosterSetParam(self.handle, name.as_ptr(), value.as_ptr()) })
    }

    /// One boosting round with the objective set in the parameters.
    pub(crate) fn update(&mut self, train: &DMatrix, round: i32) -> Result<(), ModelError> {
        // SAFETY: a live booster and a live matrix.
        check(unsafe { xgboost_sys::XGBoosterUpdateOneIter(self.handle, round, train.handle) })
    }

    /// One boosting round with a custom objective: `objective(predictions, train)` gives one
    /// gradient and one hessian per row.
    pub(crate) fn update_custom(
        &mut self,
        train: &DMatrix,
        objective: Objective,
    ) -> Result<(), ModelError> {
        let predictions = self.predict(train)?;
        let (mut grad, mut hess) = objective(&predictions, train);
        if grad.len() != predictions.len() || hess.len() != predictions.len() {
            return Err(ModelError::Xgboost(format!(
                "custom objective gave {} gradients and {} hessians for {} rows",
                grad.len(),
                hess.len(),
                predictions.len()
            )));
        }
        // SAFETY: a live booster and matrix, and two arrays of `grad.len()` floats, read
        // during the call (the API takes them mutable but does not write them).
        check(unsafe {
            xgboost_sys::XGBoosterBoostOneIter(
                self.handle,
                train.handle,
                grad.as_mut_ptr(),
                hess.as_mut_ptr(),
                grad.len() as bst_ulong,
            )
        })
    }

    /// One prediction per row (the transformed output, all trees, not in training mode).
    pub(crate) fn predict(&self, data: &DMatrix) -> Result<Vec<f32>, ModelError> {
        let (mut len, mut out) = (0, ptr::null());
        // SAFETY: a live booster and matrix; XGBoost writes a length and a pointer into its
        // own buffer, copied out before the next call on this booster. Option mask 0: plain
        // predictions; tree limit 0: all trees; training 0.
        check(unsafe {
            xgboost_sys::XGBoosterPredict(self.handle, data.handle, 0, 0, 0, &mut len, &mut out)
        })?;
        // SAFETY: XGBoost returned `len` floats at `out`.
        Ok(unsafe { copy_out(out, len) })
    }

    /// The model (trees and learner parameters) as XGBoost's JSON.
    pub(crate) fn save_json(&self) -> Result<Vec<u8>, ModelError> {
        let (mut len, mut out): (bst_ulong, *const c_char) = (0, ptr::null());
        // SAFETY: a live booster and a NUL-terminated configuration; XGBoost writes a length
        // and a pointer into its own buffer, copied out before the next call.
        check(unsafe {
            xgboost_sys::XGBoosterSaveModelToBuffer(
                self.handle,
                c"{\"format\": \"json\"}".as_ptr(),
                &mut len,
                &mut out,
            )
        })?;
        // SAFETY: XGBoost returned `len` bytes at `out`.
        Ok(unsafe { copy_out(out.cast::<u8>(), len) })
    }
}

impl Drop for Booster {
    fn drop(&mut self) {
        // SAFETY: the handle was created by XGBoosterCreate and is freed once, here. A failure
        // to free cannot be acted on in a destructor.
        let _ = unsafe { xgboost_sys::XGBoosterFree(self.handle) };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metadata_round_trips_and_bad_shapes_are_errors() {
        let mut m = DMatrix::from_dense(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], 3).unwrap();
        m.set_labels(&[0.5, 1.5, 2.5]).unwrap();
        m.set_group(&[2, 1]).unwrap();
        m.set_weights(&[1.0, 3.0]).unwrap();
        assert_eq!(m.labels().unwrap(), [0.5, 1.5, 2.5]);
        assert_eq!(m.weights().unwrap(), [1.0, 3.0]);
        assert_eq!(m.group_bounds().unwrap(), [0, 2, 3]);
        assert!(DMatrix::from_dense(&[1.0, 2.0, 3.0], 2).is_err());
        assert!(DMatrix::from_dense(&[], 0).is_err());
    }

    #[test]
    fn a_booster_fits_a_step_and_survives_json() {
        // y = 1 where x > 2: one split separates it exactly.
        let xs = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
        let ys = [0.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
        let mut m = DMatrix::from_dense(&xs, 6).unwrap();
        m.set_labels(&ys).unwrap();
        let mut b = Booster::new(&[&m]).unwrap();
        for (k, v) in [
            ("eta", "1"),
            ("max_depth", "1"),
            ("min_child_weight", "0"),
            ("lambda", "0"),
            ("base_score", "0"),
        ] {
            b.set_param(k, v).unwrap();
        }
        b.update(&m, 0).unwrap();
        let p = b.predict(&m).unwrap();
        for (got, want) in p.iter().zip(ys) {
            assert!((got - want).abs() < 1e-5, "{p:?}");
        }
        let json = b.save_json().unwrap();
        let reloaded = Booster::load_json(&json).unwrap();
        assert_eq!(reloaded.predict(&m).unwrap(), p);
        assert!(Booster::load_json(b"not a model").is_err());
        assert!(b
            .set_param("objective", "no:such")
            .and_then(|_| b.update(&m, 1))
            .is_err());
    }

    /// Squared error written as a custom objective: the same fit as the built-in one.
    fn squared_error(pred: &[f32], m: &DMatrix) -> (Vec<f32>, Vec<f32>) {
        let labels = m.labels().unwrap_or_default();
        let grad = pred.iter().zip(&labels).map(|(p, y)| p - y).collect();
        (grad, vec![1.0; pred.len()])
    }

    #[test]
    fn a_custom_objective_trains_like_the_built_in_one() {
        let xs = [0.0f32, 1.0, 2.0, 3.0, 4.0, 5.0];
        let ys = [0.0f32, 0.0, 0.0, 1.0, 1.0, 1.0];
        let mut m = DMatrix::from_dense(&xs, 6).unwrap();
        m.set_labels(&ys).unwrap();
        let mut fitted = Vec::new();
        for custom in [false, true] {
            let mut b = Booster::new(&[&m]).unwrap();
            for (k, v) in [
                ("eta", "0.5"),
                ("lambda", "0"),
                ("max_depth", "2"),
                ("base_score", "0"),
            ] {
                b.set_param(k, v).unwrap();
            }
            for round in 0..3 {
                if custom {
                    b.update_custom(&m, squared_error).unwrap();
                } else {
                    b.update(&m, round).unwrap();
                }
            }
            fitted.push(b.predict(&m).unwrap());
        }
        assert_eq!(fitted[0], fitted[1]);
        // Without L2 regularization a leaf moves by eta times its mean residual: three rounds
        // at eta 0.5 reach 7/8 of each label.
        for (got, want) in fitted[0].iter().zip(ys) {
            assert!((got - 0.875 * want).abs() < 1e-5, "{:?}", fitted[0]);
        }
    }
}
