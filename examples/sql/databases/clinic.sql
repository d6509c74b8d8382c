CREATE TABLE doctors (
  id INTEGER PRIMARY KEY,
  name TEXT,
  specialty TEXT,
  years_experience INTEGER
);
CREATE TABLE patients (
  id INTEGER PRIMARY KEY,
  name TEXT,
  birth_year INTEGER,
  city TEXT,
  insurance TEXT
);
CREATE TABLE appointments (
  id INTEGER PRIMARY KEY,
  doctor_id INTEGER REFERENCES doctors(id),
  patient_id INTEGER REFERENCES patients(id),
  date TEXT,
  fee INTEGER,
  status TEXT
);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (1, 'Ana Novak', 'cardiology', 27);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (2, 'Farid Smith', 'pediatrics', 30);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (3, 'David Dubois', 'pediatrics', 17);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (4, 'Ben Novak', 'pediatrics', 9);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (5, 'Umar Moreau', 'orthopedics', 23);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (6, 'David Muller', 'pediatrics', 14);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (7, 'Quinn Larsen', 'dermatology', 6);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (8, 'Umar Smith', 'pediatrics', 11);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (9, 'Wei Larsen', 'cardiology', 22);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (10, 'Nora Chen', 'cardiology', 11);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (11, 'Yara Tanaka', 'pediatrics', 14);
INSERT INTO doctors (id, name, specialty, years_experience) VALUES (12, 'Ines Ivanova', 'orthopedics', 2);
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (1, 'Ben Silva', 1986, 'Dublin', NULL);
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (2, 'Farid Moreau', 2002, 'Krakow', 'AXA');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (3, 'Sven Kowalski', 2012, 'Krakow', 'AXA');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (4, 'Elena Moreau', 1978, 'Oslo', 'AXA');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (5, 'Tara Muller', 1960, 'Dublin', 'Medis');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (6, 'Tara Rossi', 2011, 'Krakow', 'Medis');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (7, 'David Muller', 1990, 'Oslo', 'Medis');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (8, 'Yara Larsen', 2008, 'Lisbon', 'Allianz');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (9, 'Nora Haddad', 1965, 'Porto', NULL);
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (10, 'Kira Rossi', 1983, 'Austin', 'Medis');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (11, 'Yara Chen', 2005, 'Porto', NULL);
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (12, 'Maya Larsen', 1975, 'Porto', 'Medis');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (13, 'Yara Okafor', 1980, 'Austin', NULL);
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (14, 'Hiro Larsen', 1969, 'Krakow', 'AXA');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (15, 'Kira Kowalski', 1962, 'Lyon', 'Allianz');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (16, 'Jonas Patel', 1963, 'Krakow', NULL);
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (17, 'Zoe Rossi', 1994, 'Krakow', 'AXA');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (18, 'Chloe Smith', 2004, 'Krakow', 'Allianz');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (19, 'Omar Muller', 2017, 'Oslo', 'Medis');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (20, 'Farid Smith', 2012, 'Oslo', 'AXA');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (21, 'Ben Chen', 2008, 'Lyon', 'Allianz');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (22, 'Priya Novak', 2005, 'Porto', NULL);
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (23, 'Wei Dubois', 1993, 'Dublin', 'Medis');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (24, 'Farid Tanaka', 2019, 'Lyon', NULL);
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (25, 'Tara Silva', 1964, 'Lisbon', 'Medis');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (26, 'Yara Silva', 1988, 'Dublin', 'AXA');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (27, 'Jonas Garcia', 1973, 'Dublin', NULL);
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (28, 'Umar Novak', 1976, 'Porto', 'Allianz');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (29, 'Omar Novak', 1986, 'Krakow', 'Medis');
INSERT INTO patients (id, name, birth_year, city, insurance) VALUES (30, 'Sven Patel', 1983, 'Dublin', 'Allianz');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (1, 5, 22, '2023-04-28', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (2, 6, 21, '2023-03-25', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (3, 6, 20, '2025-12-22', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (4, 1, 2, '2025-08-27', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (5, 3, 6, '2024-07-27', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (6, 1, 6, '2023-03-19', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (7, 11, 15, '2023-07-26', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (8, 2, 22, '2025-04-21', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (9, 2, 4, '2024-01-04', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (10, 6, 18, '2024-12-16', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (11, 12, 30, '2024-01-25', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (12, 5, 5, '2024-09-16', 40, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (13, 2, 15, '2024-07-21', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (14, 5, 29, '2025-01-14', 60, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (15, 1, 25, '2025-12-19', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (16, 8, 9, '2024-10-26', 150, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (17, 4, 25, '2025-07-13', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (18, 6, 12, '2024-05-22', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (19, 11, 3, '2024-02-22', 40, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (20, 11, 16, '2024-07-11', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (21, 9, 9, '2023-03-06', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (22, 2, 7, '2024-11-13', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (23, 9, 13, '2024-02-17', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (24, 10, 13, '2025-08-07', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (25, 4, 9, '2023-01-06', 200, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (26, 4, 2, '2024-10-13', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (27, 12, 7, '2025-02-13', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (28, 10, 30, '2024-01-23', 60, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (29, 7, 14, '2024-01-12', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (30, 11, 9, '2023-01-18', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (31, 8, 18, '2025-07-11', 200, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (32, 12, 25, '2023-10-28', 80, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (33, 11, 2, '2024-12-11', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (34, 12, 2, '2023-10-06', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (35, 5, 17, '2023-07-20', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (36, 1, 3, '2024-07-23', 200, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (37, 9, 12, '2024-08-16', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (38, 8, 21, '2025-06-08', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (39, 6, 7, '2023-03-26', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (40, 11, 21, '2025-07-19', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (41, 9, 1, '2024-05-03', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (42, 5, 27, '2023-03-21', 200, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (43, 4, 16, '2025-11-27', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (44, 6, 28, '2024-06-02', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (45, 11, 12, '2024-07-22', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (46, 6, 13, '2024-04-28', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (47, 6, 28, '2025-01-26', 80, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (48, 9, 9, '2025-09-19', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (49, 11, 20, '2024-06-05', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (50, 12, 20, '2023-10-02', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (51, 8, 22, '2024-08-28', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (52, 9, 14, '2024-11-21', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (53, 9, 28, '2025-09-02', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (54, 2, 18, '2025-07-11', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (55, 2, 10, '2023-05-08', 80, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (56, 11, 6, '2023-06-11', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (57, 11, 12, '2024-03-23', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (58, 12, 27, '2024-04-26', 200, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (59, 3, 20, '2023-12-20', 120, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (60, 2, 13, '2023-02-12', 60, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (61, 10, 28, '2024-09-28', 120, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (62, 6, 3, '2023-07-10', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (63, 4, 17, '2023-06-12', 80, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (64, 9, 26, '2024-10-21', 40, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (65, 11, 25, '2023-07-10', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (66, 3, 22, '2025-12-03', 40, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (67, 4, 23, '2025-07-03', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (68, 7, 6, '2025-04-03', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (69, 10, 3, '2025-08-14', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (70, 3, 16, '2025-07-19', 60, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (71, 11, 28, '2023-01-19', 200, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (72, 12, 12, '2023-04-10', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (73, 9, 4, '2024-03-14', 80, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (74, 7, 3, '2025-10-09', 150, 'scheduled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (75, 8, 14, '2024-11-02', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (76, 1, 5, '2024-08-21', 200, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (77, 2, 10, '2025-12-26', 150, 'cancelled');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (78, 7, 23, '2025-09-03', 150, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (79, 5, 8, '2024-05-25', 120, 'completed');
INSERT INTO appointments (id, doctor_id, patient_id, date, fee, status) VALUES (80, 6, 1, '2023-06-18', 120, 'completed');
